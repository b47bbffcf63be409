"""Landscapes shipped with the emulator (see ../landscape.py for the interface)."""
