"""The example's model as Vertex AI's prebuilt scikit-learn container serves it, and its held-out
evaluation (issue 37).

The numpy MLP (tanh hidden layer, softmax output, inputs standardised with the training rows'
statistics) is the same function as a scikit-learn Pipeline of a StandardScaler and an
MLPClassifier(activation="tanh"): `sklearn_model` builds that pipeline from the trained weights,
so `model.joblib` answers `predict(instances)` with the classes the numpy model predicts (raw
feature rows in, as the container hands them). scikit-learn's binary MLP has one logistic
output: the two softmax logits become their difference (the same probabilities).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

log = logging.getLogger("example")

SERVING_FILE = "model.joblib"  # what the prebuilt scikit-learn container loads


def sklearn_model(params: Mapping[str, np.ndarray], mean: np.ndarray, std: np.ndarray,
                  classes: int) -> Any:
    """A fitted sklearn Pipeline(StandardScaler, MLPClassifier) computing the numpy model."""
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    features, hidden = params["w1"].shape
    # A one-sample partial fit sets every fitted attribute the estimators need; the weights
    # and statistics are then replaced by the trained ones.
    x0 = np.zeros((classes, features))
    y0 = np.arange(classes)
    scaler = StandardScaler().fit(x0)
    scaler.mean_, scaler.scale_, scaler.var_ = (np.asarray(mean, dtype=np.float64),
                                                np.asarray(std, dtype=np.float64),
                                                np.asarray(std, dtype=np.float64) ** 2)
    mlp = MLPClassifier(hidden_layer_sizes=(hidden,), activation="tanh")
    mlp.partial_fit(x0, y0, classes=y0)
    w2, b2 = np.asarray(params["w2"]), np.asarray(params["b2"])
    if classes == 2:
        w2, b2 = (w2[:, 1] - w2[:, 0]).reshape(-1, 1), np.array([b2[1] - b2[0]])
    mlp.coefs_ = [np.asarray(params["w1"], dtype=np.float64), w2.astype(np.float64)]
    mlp.intercepts_ = [np.asarray(params["b1"], dtype=np.float64), b2.astype(np.float64)]
    return Pipeline([("scale", scaler), ("mlp", mlp)])


def joblib_bytes(model: Any) -> bytes:
    """The model as the container's joblib.load reads it."""
    import joblib

    buf = io.BytesIO()
    joblib.dump(model, buf)
    return buf.getvalue()
