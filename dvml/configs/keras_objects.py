"""The tf-keras losses, metrics and optimizers compile parameters may name, without Keras.

A loss or metric given as an object, ``loss=CategoricalCrossentropy(label_smoothing=0.1)``, is
checked on the client against these tables: the class must be one of tf-keras' own (2.21),
every keyword must be one its ``__init__`` accepts, required ones must be given, and each value
must have the type (and range) that Keras would accept. The tables were read from tf-keras'
signatures; ``tests/train/test_keras_objects.py`` checks them against the installed tf-keras, so
a new tf-keras release that changes a signature fails that test instead of a trainer.

dvml's preprocessor one-hot encodes every label, so the sparse losses and metrics (which expect
integer labels) are refused with the one-hot equivalent to use instead.
"""

from __future__ import annotations

__all__ = [
    "ARGUMENT_KINDS",
    "ENUMS",
    "LOSS_CLASSES",
    "LOSS_NAMES",
    "METRIC_CLASSES",
    "METRIC_NAMES",
    "OPTIMIZER_CLASSES",
    "SPARSE_REPLACEMENTS",
]

# class name -> (keyword arguments of __init__, required ones, the name Keras reports by default)
LOSS_CLASSES: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    "BinaryCrossentropy": (
        ("from_logits", "label_smoothing", "axis", "reduction", "name"),
        (),
        "binary_crossentropy",
    ),
    "BinaryFocalCrossentropy": (
        (
            "apply_class_balancing",
            "alpha",
            "gamma",
            "from_logits",
            "label_smoothing",
            "axis",
            "reduction",
            "name",
        ),
        (),
        "binary_focal_crossentropy",
    ),
    "CategoricalCrossentropy": (
        ("from_logits", "label_smoothing", "axis", "reduction", "name"),
        (),
        "categorical_crossentropy",
    ),
    "CategoricalFocalCrossentropy": (
        ("alpha", "gamma", "from_logits", "label_smoothing", "axis", "reduction", "name"),
        (),
        "categorical_focal_crossentropy",
    ),
    "CategoricalHinge": (("reduction", "name"), (), "categorical_hinge"),
    "CosineSimilarity": (("axis", "reduction", "name"), (), "cosine_similarity"),
    "Hinge": (("reduction", "name"), (), "hinge"),
    "Huber": (("delta", "reduction", "name"), (), "huber_loss"),
    "KLDivergence": (("reduction", "name"), (), "kl_divergence"),
    "LogCosh": (("reduction", "name"), (), "log_cosh"),
    "MeanAbsoluteError": (("reduction", "name"), (), "mean_absolute_error"),
    "MeanAbsolutePercentageError": (("reduction", "name"), (), "mean_absolute_percentage_error"),
    "MeanSquaredError": (("reduction", "name"), (), "mean_squared_error"),
    "MeanSquaredLogarithmicError": (("reduction", "name"), (), "mean_squared_logarithmic_error"),
    "Poisson": (("reduction", "name"), (), "poisson"),
    "SparseCategoricalCrossentropy": (
        ("from_logits", "ignore_class", "reduction", "name"),
        (),
        "sparse_categorical_crossentropy",
    ),
    "SquaredHinge": (("reduction", "name"), (), "squared_hinge"),
}

_OPTIMIZER_COMMON = (
    "weight_decay",
    "clipnorm",
    "clipvalue",
    "global_clipnorm",
    "use_ema",
    "ema_momentum",
    "ema_overwrite_frequency",
    "jit_compile",
    "name",
)

# optimizer class -> the keyword arguments of its __init__ (tf-keras' optimizers refuse others)
OPTIMIZER_CLASSES: dict[str, tuple[str, ...]] = {
    "Adadelta": ("learning_rate", "rho", "epsilon", *_OPTIMIZER_COMMON),
    "Adafactor": (
        "learning_rate",
        "beta_2_decay",
        "epsilon_1",
        "epsilon_2",
        "clip_threshold",
        "relative_step",
        *_OPTIMIZER_COMMON,
    ),
    "Adagrad": ("learning_rate", "initial_accumulator_value", "epsilon", *_OPTIMIZER_COMMON),
    "Adam": (
        "learning_rate",
        "beta_1",
        "beta_2",
        "epsilon",
        "adaptive_epsilon",
        "amsgrad",
        *_OPTIMIZER_COMMON,
    ),
    "AdamW": (
        "learning_rate",
        "weight_decay",
        "beta_1",
        "beta_2",
        "epsilon",
        "amsgrad",
        *_OPTIMIZER_COMMON[1:],
    ),
    "Adamax": ("learning_rate", "beta_1", "beta_2", "epsilon", *_OPTIMIZER_COMMON),
    "Ftrl": (
        "learning_rate",
        "learning_rate_power",
        "initial_accumulator_value",
        "l1_regularization_strength",
        "l2_regularization_strength",
        "l2_shrinkage_regularization_strength",
        "beta",
        *_OPTIMIZER_COMMON,
    ),
    "Lion": ("learning_rate", "beta_1", "beta_2", *_OPTIMIZER_COMMON),
    "Nadam": ("learning_rate", "beta_1", "beta_2", "epsilon", *_OPTIMIZER_COMMON),
    "RMSprop": (
        "learning_rate",
        "rho",
        "momentum",
        "epsilon",
        "centered",
        *_OPTIMIZER_COMMON,
    ),
    "SGD": ("learning_rate", "momentum", "nesterov", *_OPTIMIZER_COMMON),
}

_NAME_DTYPE = ("name", "dtype")
_THRESHOLDS = ("thresholds", "name", "dtype")
_AT = ("num_thresholds", "class_id", "name", "dtype")

METRIC_CLASSES: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    "AUC": (
        (
            "num_thresholds",
            "curve",
            "summation_method",
            "name",
            "dtype",
            "thresholds",
            "multi_label",
            "num_labels",
            "label_weights",
            "from_logits",
        ),
        (),
        "auc",
    ),
    "Accuracy": (_NAME_DTYPE, (), "accuracy"),
    "BinaryAccuracy": (("name", "dtype", "threshold"), (), "binary_accuracy"),
    "BinaryCrossentropy": (
        ("name", "dtype", "from_logits", "label_smoothing"),
        (),
        "binary_crossentropy",
    ),
    "BinaryIoU": (("target_class_ids", "threshold", "name", "dtype"), (), "binary_io_u"),
    "CategoricalAccuracy": (_NAME_DTYPE, (), "categorical_accuracy"),
    "CategoricalCrossentropy": (
        ("name", "dtype", "from_logits", "label_smoothing", "axis"),
        (),
        "categorical_crossentropy",
    ),
    "CategoricalHinge": (_NAME_DTYPE, (), "categorical_hinge"),
    "CosineSimilarity": (("name", "dtype", "axis"), (), "cosine_similarity"),
    "F1Score": (("average", "threshold", "name", "dtype"), (), "f1_score"),
    "FBetaScore": (("average", "beta", "threshold", "name", "dtype"), (), "fbeta_score"),
    "FalseNegatives": (_THRESHOLDS, (), "false_negatives"),
    "FalsePositives": (_THRESHOLDS, (), "false_positives"),
    "Hinge": (_NAME_DTYPE, (), "hinge"),
    "IoU": (
        (
            "num_classes",
            "target_class_ids",
            "name",
            "dtype",
            "ignore_class",
            "sparse_y_true",
            "sparse_y_pred",
            "axis",
        ),
        ("num_classes", "target_class_ids"),
        "io_u",
    ),
    "KLDivergence": (_NAME_DTYPE, (), "kullback_leibler_divergence"),
    "LogCoshError": (_NAME_DTYPE, (), "logcosh"),
    "MeanAbsoluteError": (_NAME_DTYPE, (), "mean_absolute_error"),
    "MeanAbsolutePercentageError": (_NAME_DTYPE, (), "mean_absolute_percentage_error"),
    "MeanIoU": (
        ("num_classes", "name", "dtype", "ignore_class", "sparse_y_true", "sparse_y_pred", "axis"),
        ("num_classes",),
        "mean_io_u",
    ),
    "MeanSquaredError": (_NAME_DTYPE, (), "mean_squared_error"),
    "MeanSquaredLogarithmicError": (_NAME_DTYPE, (), "mean_squared_logarithmic_error"),
    "OneHotIoU": (
        (
            "num_classes",
            "target_class_ids",
            "name",
            "dtype",
            "ignore_class",
            "sparse_y_pred",
            "axis",
        ),
        ("num_classes", "target_class_ids"),
        "one_hot_io_u",
    ),
    "OneHotMeanIoU": (
        ("num_classes", "name", "dtype", "ignore_class", "sparse_y_pred", "axis"),
        ("num_classes",),
        "one_hot_mean_io_u",
    ),
    "Poisson": (_NAME_DTYPE, (), "poisson"),
    "Precision": (("thresholds", "top_k", "class_id", "name", "dtype"), (), "precision"),
    "PrecisionAtRecall": (("recall", *_AT), ("recall",), "precision_at_recall"),
    "R2Score": (("class_aggregation", "num_regressors", "name", "dtype"), (), "r2_score"),
    "Recall": (("thresholds", "top_k", "class_id", "name", "dtype"), (), "recall"),
    "RecallAtPrecision": (("precision", *_AT), ("precision",), "recall_at_precision"),
    "RootMeanSquaredError": (_NAME_DTYPE, (), "root_mean_squared_error"),
    "SensitivityAtSpecificity": (
        ("specificity", *_AT),
        ("specificity",),
        "sensitivity_at_specificity",
    ),
    "SparseCategoricalAccuracy": (_NAME_DTYPE, (), "sparse_categorical_accuracy"),
    "SparseCategoricalCrossentropy": (
        ("name", "dtype", "from_logits", "ignore_class", "axis"),
        (),
        "sparse_categorical_crossentropy",
    ),
    "SparseTopKCategoricalAccuracy": (
        ("k", "name", "dtype"),
        (),
        "sparse_top_k_categorical_accuracy",
    ),
    "SpecificityAtSensitivity": (
        ("sensitivity", *_AT),
        ("sensitivity",),
        "specificity_at_sensitivity",
    ),
    "SquaredHinge": (_NAME_DTYPE, (), "squared_hinge"),
    "TopKCategoricalAccuracy": (("k", "name", "dtype"), (), "top_k_categorical_accuracy"),
    "TrueNegatives": (_THRESHOLDS, (), "true_negatives"),
    "TruePositives": (_THRESHOLDS, (), "true_positives"),
}

# Functions (and their aliases) that tf_keras.losses.get and tf_keras.metrics.get both resolve.
_SHARED_FUNCTIONS = (
    "binary_crossentropy",
    "binary_focal_crossentropy",
    "categorical_crossentropy",
    "categorical_focal_crossentropy",
    "hinge",
    "kl_divergence",
    "kld",
    "kullback_leibler_divergence",
    "log_cosh",
    "logcosh",
    "mae",
    "mape",
    "mean_absolute_error",
    "mean_absolute_percentage_error",
    "mean_squared_error",
    "mean_squared_logarithmic_error",
    "mse",
    "msle",
    "poisson",
    "sparse_categorical_crossentropy",
    "squared_hinge",
)
_LOSS_FUNCTIONS = (*_SHARED_FUNCTIONS, "categorical_hinge", "cosine_similarity", "huber")
_METRIC_FUNCTIONS = (
    *_SHARED_FUNCTIONS,
    "binary_accuracy",
    "categorical_accuracy",
    "sparse_categorical_accuracy",
    "sparse_top_k_categorical_accuracy",
    "top_k_categorical_accuracy",
)

LOSS_NAMES: frozenset[str] = frozenset(_LOSS_FUNCTIONS) | frozenset(LOSS_CLASSES)
"""Plain names that ``tf_keras.losses.get`` resolves (functions, aliases and classes)."""

METRIC_NAMES: frozenset[str] = (
    frozenset(_METRIC_FUNCTIONS)
    | frozenset({"accuracy", "acc", "crossentropy", "ce"})  # resolved by model.compile itself
    | frozenset(name for name, (_, required, _) in METRIC_CLASSES.items() if not required)
)
"""Plain names that ``model.compile(metrics=[...])`` resolves."""

SPARSE_REPLACEMENTS: dict[str, str] = {
    "sparse_categorical_crossentropy": "categorical_crossentropy",
    "SparseCategoricalCrossentropy": "CategoricalCrossentropy",
    "sparse_categorical_accuracy": "categorical_accuracy",
    "SparseCategoricalAccuracy": "CategoricalAccuracy",
    "sparse_top_k_categorical_accuracy": "top_k_categorical_accuracy",
    "SparseTopKCategoricalAccuracy": "TopKCategoricalAccuracy",
    "IoU": "OneHotIoU",
    "MeanIoU": "OneHotMeanIoU",
}
"""Losses and metrics for integer labels, refused (dvml's labels are one-hot) -> what to use."""

# keyword argument -> kind of value Keras accepts (checked by dvml.configs.keras_specs)
ARGUMENT_KINDS: dict[str, str] = {
    "name": "str",
    "dtype": "dtype",
    "reduction": "reduction",
    "from_logits": "bool",
    "apply_class_balancing": "bool",
    "multi_label": "bool",
    "sparse_y_true": "bool",
    "sparse_y_pred": "bool",
    "label_smoothing": "unit",
    "alpha": "unit",
    "threshold": "unit_or_none",
    "recall": "unit",
    "precision": "unit",
    "specificity": "unit",
    "sensitivity": "unit",
    "thresholds": "thresholds",
    "gamma": "nonnegative",
    "delta": "positive",
    "beta": "positive",
    "axis": "int",
    "k": "positive_int",
    "num_classes": "positive_int",
    "num_thresholds": "threshold_count",
    "num_labels": "positive_int_or_none",
    "top_k": "positive_int_or_none",
    "class_id": "nonnegative_int_or_none",
    "ignore_class": "int_or_none",
    "num_regressors": "nonnegative_int",
    "target_class_ids": "int_list",
    "label_weights": "real_list_or_none",
    "curve": "curve",
    "summation_method": "summation_method",
    "average": "average",
    "class_aggregation": "class_aggregation",
}

ENUMS: dict[str, tuple[object, ...]] = {
    "reduction": ("auto", "none", "sum", "sum_over_batch_size"),
    "dtype": ("float16", "bfloat16", "float32", "float64"),
    "curve": ("ROC", "PR"),
    "summation_method": ("interpolation", "minoring", "majoring"),
    "average": (None, "micro", "macro", "weighted"),
    "class_aggregation": (None, "uniform_average", "variance_weighted_average"),
}
