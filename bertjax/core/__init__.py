"""The trainer core every mode shares."""
