"""SWE bug injection (paper 4.2, appendix 13) as a propel domain."""
