"""kvforensics command line: the console script over forensics, replay and reports."""
