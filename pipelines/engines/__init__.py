"""The bigdl engine (BigDL DLlib preprocessing + Orca OpenVINO), run only in its own env."""
