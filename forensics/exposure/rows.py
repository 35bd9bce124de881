"""The page sweep's vocabulary, shared by the kernel and the sweep that feeds it: the op codes of
its events, the columns of its output rows, and the slots of its bookkeeping."""

from __future__ import annotations

ALLOC, SHARE, WRITE, READ, FREE, START = 0, 1, 2, 3, 4, 5  # START: an inferred read
NO_VERSION = -1  # content of a page never written in this boot
OPEN = -1  # end seq of a reading interval still open at the end of its boot
WIDTH = 8  # output rows: six key columns (unused ones 0), then the page range lo, hi
LO, HI = 6, 7
# the key columns of each kind of output row
EXP_NB, EXP_READER, EXP_VICTIM, EXP_VERSION, EXP_SEQ, EXP_INFERRED = 0, 1, 2, 3, 4, 5  # walk's exposures
ISL_NB, ISL_READER, ISL_VICTIM, ISL_SEQ, ISL_INFERRED, ISL_TS = 0, 1, 2, 3, 4, 5  # islands' (ts: the sweep's)
UNI_NB, UNI_READER, UNI_SEQ, UNI_INFERRED = 0, 1, 2, 3  # uninitialized reads
RD_NB, RD_READER, RD_START, RD_END, RD_INFERRED = 0, 1, 2, 3, 4  # reading intervals, ended or still open
SH_READER, SH_VERSION = 0, 1  # versions a reader took as its own by share

# slots of ``used``
FRAGS, SETS, ITEMS, LONGEST, HELD, HELD_LIVE = 0, 1, 2, 3, 4, 5
EXPOSED, UNINITIALIZED, ENDED, STILL_OPEN, SHARED = 6, 7, 8, 9, 10
N_USED = 11

# columns of the kernel's state arrays
F_PAGE, F_VERSION, F_READERS = 0, 1, 2  # frags: first page, content version, reader set
S_AT, S_LEN = 0, 1  # sets: offset and length of a reader set's items
I_READER, I_START, I_INFERRED = 0, 1, 2  # items: a reader, the seq its read started, inferred
H_LO, H_HI = 0, 1  # held: a held page range
AT_OFFSET, AT_COUNT, AT_NB = 0, 1, 2  # held_at: where a request's held ranges are, of which nb (+1)
WRITER = 0  # writers: the request that wrote a version
