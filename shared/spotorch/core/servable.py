"""Can the version's prebuilt prediction container load its artifact? (issue 37; pure)

Vertex AI's prebuilt prediction containers load the model by file name from the version's
artifact_uri folder (FACTS.md, Vertex AI "prebuilt containers for prediction"): scikit-learn
`model.joblib` or `model.pkl`; XGBoost `model.bst`, `model.joblib` or `model.pkl`; TensorFlow a
SavedModel (`saved_model.pb`); PyTorch a `model.mar` archive. A serving image that is not one of
Vertex's prebuilt ones (a custom container) is not checked: what it loads is its own business.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# us-docker.pkg.dev/vertex-ai/prediction/sklearn-cpu.1-3:latest (europe-docker..., asia-docker...)
_PREBUILT = re.compile(r"^(?:[a-z]+-)?docker\.pkg\.dev/vertex-ai(?:-restricted)?/prediction/"
                       r"(?P<framework>[a-z0-9]+)-(?:cpu|gpu)[.:]")
ARTIFACTS: dict[str, tuple[str, ...]] = {
    "sklearn": ("model.joblib", "model.pkl"),
    "xgboost": ("model.bst", "model.joblib", "model.pkl"),
    "tf2": ("saved_model.pb",),
    "tf": ("saved_model.pb",),
    "pytorch": ("model.mar",),
}
_NAMES = {"sklearn": "scikit-learn", "xgboost": "XGBoost", "tf2": "TensorFlow",
          "tf": "TensorFlow", "pytorch": "PyTorch"}


def framework_of(serving_image: str) -> str | None:
    """The framework of one of Vertex's prebuilt prediction images; None for any other image."""
    found = _PREBUILT.match(serving_image or "")
    return found["framework"] if found and found["framework"] in ARTIFACTS else None


def servable_problem(serving_image: str, artifact_uri: str, names: Iterable[str]) -> str | None:
    """Why the prebuilt container cannot load the artifact (None: it can, or the image is not
    a prebuilt one). names: the files directly in the artifact_uri folder."""
    framework = framework_of(serving_image)
    if framework is None:
        return None
    wanted = ARTIFACTS[framework]
    present = sorted(set(names))
    found = [n for n in wanted if n in present]
    if not found:
        seen = ", ".join(present[:8]) + (" ..." if len(present) > 8 else "") or "nothing"
        return (f"{serving_image} ({_NAMES[framework]}) cannot serve {artifact_uri}: it loads "
                f"{' or '.join(wanted)} from that folder, which holds {seen}; write a model "
                f"file it loads, or name another serving_image")
    if framework in ("sklearn", "xgboost") and len(found) > 1:
        return (f"{serving_image} cannot serve {artifact_uri}: it holds {' and '.join(found)}; "
                "the container needs exactly one model file")
    return None
