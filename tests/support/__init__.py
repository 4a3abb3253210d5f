"""Helpers the tests share (no tests here): stand-ins, fixtures and job kinds, one module per subject."""
