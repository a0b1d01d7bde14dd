"""Helpers shared by test modules in different folders (tests/ is on the import path through its
conftest.py): each module holds one concept a test in another folder also needs."""
