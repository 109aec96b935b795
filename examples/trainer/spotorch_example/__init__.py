"""spotorch's example training code, as a Python package Vertex AI runs on a prebuilt container."""
