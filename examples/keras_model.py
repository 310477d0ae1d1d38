"""Your own Keras model in a fastflip experiment.

Point an experiment at this file::

    trainer:
      framework: keras
      model_file: keras_model.py     # relative to the configuration file
      batch_size: 64                 # optional; also: checkpoint_format: keras (for .keras archives)

fastflip's built-in Keras trainer imports the file and calls two functions:

``build_model()``
    Return a *compiled* Keras 3 model (optimizer and loss set). It is called once
    with Keras' random seed already set from the experiment's ``seed``; build it
    the same way every time. Checkpoints are the model's ``.weights.h5`` files,
    which hold the optimizer's variables too, so a run resumes exactly.
``load_data()``
    Return ``(x_train, y_train, x_test, y_test)`` as NumPy arrays with integer
    labels. Accuracy is measured on the test part after every epoch.

The trainer shuffles the training data itself, with an order derived from the seed
and the epoch number, so the golden run and every resumed run see the same batches.
Avoid layers whose randomness is not seeded by ``keras.utils.set_random_seed``.
"""

from __future__ import annotations

import keras
import numpy as np


def load_data():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data.astype("float32") / 16.0)  # 64 pixel features
    y = d.target.astype("int64")
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order], y[order]
    return x[360:], y[360:], x[:360], y[:360]


def build_model():
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(64, activation="relu", name="hidden"),
            keras.layers.BatchNormalization(momentum=0.9, name="bn"),
            keras.layers.Dense(10, name="out"),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
