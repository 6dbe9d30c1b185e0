"""Countdown: reach a target by combining given numbers with + - * /, each used at most once."""
