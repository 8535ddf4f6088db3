"""Tests of dvml.configs' parameter language: the safe MADlib-style compile/fit parameter parser."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from dvml.configs import (
    COMPILE_KEYS,
    FIT_KEYS,
    MAX_DEPTH,
    MAX_LENGTH,
    build_optimizer,
    compile_kwargs,
    format_params,
    parse_compile_params,
    parse_fit_params,
)
from dvml.exceptions import ParameterError

# ----------------------------------------------------------------------------- good input


def test_madlib_compile_string():
    parsed = parse_compile_params(
        "loss='categorical_crossentropy', optimizer='adam', metrics=['accuracy']"
    )
    assert parsed == {
        "loss": "categorical_crossentropy",
        "optimizer": "adam",
        "metrics": ["accuracy"],
    }


def test_madlib_fit_string():
    assert parse_fit_params("batch_size=32, epochs=2, verbose=0") == {
        "batch_size": 32,
        "epochs": 2,
        "verbose": 0,
    }


def test_order_is_kept():
    parsed = parse_fit_params("verbose=1, epochs=3, batch_size=8")
    assert list(parsed) == ["verbose", "epochs", "batch_size"]


@pytest.mark.parametrize("empty", [None, "", "   ", {}])
def test_empty_means_no_parameters(empty):
    assert parse_compile_params(empty) == {}
    assert parse_fit_params(empty) == {}


def test_whitespace_newlines_trailing_comma_and_comment():
    text = """
        batch_size = 16,
        epochs=4,   # a comment
    """
    assert parse_fit_params(text) == {"batch_size": 16, "epochs": 4}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "optimizer='SGD(learning_rate=0.01, momentum=0.9)'",
            {"class_name": "SGD", "config": {"learning_rate": 0.01, "momentum": 0.9}},
        ),
        ("optimizer='Adam(lr=0.001)'", {"class_name": "Adam", "config": {"learning_rate": 0.001}}),
        ("optimizer='sgd(lr=1)'", {"class_name": "SGD", "config": {"learning_rate": 1}}),
        (
            "optimizer='rmsprop(rho=0.9, centered=True, epsilon=1e-07)'",
            {"class_name": "RMSprop", "config": {"rho": 0.9, "centered": True, "epsilon": 1e-07}},
        ),
        ("optimizer='Adam()'", {"class_name": "Adam", "config": {}}),
        ("optimizer='adam'", "adam"),
        ("optimizer='Adam'", "Adam"),
        (
            'optimizer="SGD(lr=0.1, nesterov=True, clipnorm=1.0)"',
            {
                "class_name": "SGD",
                "config": {"learning_rate": 0.1, "nesterov": True, "clipnorm": 1.0},
            },
        ),
    ],
)
def test_optimizer_forms(text, expected):
    assert parse_compile_params(text)["optimizer"] == expected


def test_all_compile_keys():
    text = (
        "loss='mse', optimizer='adam', metrics=['mae', 'mse'], loss_weights=[1.0, 0.5], "
        "weighted_metrics=['accuracy'], run_eagerly=False, steps_per_execution=4, "
        "jit_compile=True, sample_weight_mode=None"
    )
    parsed = parse_compile_params(text)
    assert list(parsed) == list(COMPILE_KEYS)
    assert parsed["loss_weights"] == [1.0, 0.5]
    assert parsed["run_eagerly"] is False and parsed["jit_compile"] is True


def test_all_fit_keys():
    text = (
        "batch_size=32, epochs=10, verbose=2, shuffle=False, class_weight={0: 1.0, 1: 2.5}, "
        "steps_per_epoch=100, validation_steps=5, validation_freq=2, initial_epoch=0, "
        "sample_weight_mode='temporal', callbacks=[TensorBoard(log_dir='/tmp/tb')]"
    )
    parsed = parse_fit_params(text)
    assert list(parsed) == list(FIT_KEYS)
    assert parsed["shuffle"] is False
    assert parsed["class_weight"] == {0: 1.0, 1: 2.5}


def test_custom_loss_name_is_just_a_string():
    parsed = parse_compile_params("loss='my_registered_loss', metrics=['my_metric']")
    assert parsed == {"loss": "my_registered_loss", "metrics": ["my_metric"]}


def test_loss_weights_dict_and_nullable_keys():
    parsed = parse_compile_params("loss_weights={'out_a': 1, 'out_b': -0.5}, run_eagerly=None")
    assert parsed == {"loss_weights": {"out_a": 1, "out_b": -0.5}, "run_eagerly": None}
    assert parse_fit_params("steps_per_epoch=None") == {"steps_per_epoch": None}


def test_negative_numbers_are_literals():
    assert parse_compile_params("loss_weights=[-1, +2.5]")["loss_weights"] == [-1, 2.5]


def test_dict_input_is_checked_the_same():
    parsed = parse_compile_params(
        {"loss": "mse", "optimizer": {"class_name": "sgd", "config": {"lr": np.float64(0.1)}}}
    )
    assert parsed == {
        "loss": "mse",
        "optimizer": {"class_name": "SGD", "config": {"learning_rate": 0.1}},
    }
    fit = parse_fit_params({"batch_size": np.int64(16), "epochs": 1})
    assert fit == {"batch_size": 16, "epochs": 1}
    assert type(fit["batch_size"]) is int


def test_dict_input_refuses_objects():
    with pytest.raises(ParameterError, match="loss"):
        parse_compile_params({"loss": lambda y_true, y_pred: 0})
    with pytest.raises(ParameterError, match="callbacks"):
        parse_fit_params({"callbacks": [object()]})
    with pytest.raises(ParameterError, match="finite"):
        parse_fit_params({"class_weight": {0: float("nan")}})
    with pytest.raises(ParameterError, match="must be strings"):
        parse_fit_params({1: 2})
    with pytest.raises(ParameterError, match="optimizer"):
        parse_compile_params({"optimizer": {"class_name": "SGD", "config": {}, "extra": 1}})


def test_dict_input_optimizer_string_is_parsed():
    parsed = parse_compile_params({"optimizer": "Adam(lr=0.5)"})
    assert parsed["optimizer"] == {"class_name": "Adam", "config": {"learning_rate": 0.5}}


@pytest.mark.parametrize("value", [42, 1.5, ["a=1"], b"a=1"])
def test_wrong_container_type(value):
    with pytest.raises(ParameterError, match="string, a dict or None"):
        parse_fit_params(value)


# ----------------------------------------------------------------------------- hostile input


def _marker() -> str:
    return f"/tmp/dvml-pwned-{uuid.uuid4().hex}"


HOSTILE = [
    "__import__('os').system('touch {m}')",
    "loss=__import__('os').system('touch {m}')",
    "loss=__import__('os')",
    "loss=open('{m}', 'w')",
    "loss='mse', optimizer=__import__('subprocess').call(['touch', '{m}'])",
    'optimizer=\'__import__("os").system("touch {m}")\'',
    'optimizer=\'SGD(lr=__import__("os").system("touch {m}"))\'',
    "optimizer='SGD(lr=0.1).__class__'",
    "loss=(lambda: __import__('os').system('touch {m}'))()",
    "loss=lambda y, p: 0",
    "loss=os.path",
    'loss=f\'{{__import__("os").system("touch {m}")}}\'',
    "loss='a' + 'b'",
    "epochs=[x for x in range(3)]",
    "epochs=(yield)",
    "epochs=(x := 3)",
    "**{{'loss': 'mse'}}",
    "*['mse']",
    "'mse'",
    "1+",
    "loss='mse'), g(x=1",
    "loss='mse')(x=1",
    "loss='mse')[0",
    "loss='mse'\n)\nimport os\nf(",
    "loss=b'mse'",
    "loss=1j",
    "loss=...",
    "loss=mse",
    "loss={{'a'}}",
    "loss={{**{{}}}}",
    "loss=--1",
    "loss=not 1",
    "loss='mse' if 1 else 'mae'",
    "loss=\x00",
]


@pytest.mark.parametrize("template", HOSTILE)
@pytest.mark.parametrize("parser", [parse_compile_params, parse_fit_params])
def test_hostile_strings_raise_and_run_nothing(template, parser):
    marker = _marker()
    text = template.format(m=marker)
    with pytest.raises(ParameterError):
        parser(text)
    assert not os.path.exists(marker)


def test_the_classic_pwned_string_runs_nothing():
    existed = os.path.exists("/tmp/pwned")
    for text in ("__import__('os').system('touch /tmp/pwned')", "loss=__import__('os')"):
        with pytest.raises(ParameterError):
            parse_compile_params(text)
    assert os.path.exists("/tmp/pwned") == existed


def test_positional_value_is_named_in_the_error():
    with pytest.raises(ParameterError, match=r"value without a name.*__import__"):
        parse_compile_params("__import__('os').system('x')")


def test_kwargs_unpacking_refused():
    with pytest.raises(ParameterError, match=r"\*\*-unpacking"):
        parse_fit_params("**kw")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("loss=lambda y, p: 0", "Lambda"),
        ("loss=os.path", "Attribute"),
        ("loss=f'x'", "f-strings"),
        ("loss=str(1)", "Call"),
        ("loss=mse", "bare name mse"),
    ],
)
def test_non_literals_named(text, match):
    with pytest.raises(ParameterError, match=match) as info:
        parse_compile_params(text)
    assert "'loss'" in str(info.value)


def test_deep_nesting_refused_before_parsing():
    with pytest.raises(ParameterError, match="nest too deeply"):
        parse_compile_params("loss=((((((((((((1))))))))))))")
    with pytest.raises(ParameterError, match="nest too deeply"):
        parse_compile_params("loss=" + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))


def test_depth_at_the_limit_passes_the_guard():
    text = "loss_weights=" + "[" * MAX_DEPTH + "1" + "]" * MAX_DEPTH
    with pytest.raises(ParameterError) as info:
        parse_compile_params(text)
    assert "deeply" not in str(info.value)  # refused for its type, not its depth


def test_hundred_thousand_brackets_fail_fast():
    start = time.perf_counter()
    with pytest.raises(ParameterError, match="Too many characters"):
        parse_compile_params("[" * 100_000)
    with pytest.raises(ParameterError, match="nest too deeply"):
        parse_compile_params("[" * (MAX_LENGTH - 10))
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize(
    "text",
    [
        "loss=" + "-" * 9000 + "1",
        "loss=" + "not " * 2000 + "1",
        "loss=" + "a." * 4000 + "b",
        "loss=" + "f" + "()" * 3000,
        "loss=" + "1" * 5000,
    ],
)
def test_parser_stress_is_contained(text):
    assert len(text) <= MAX_LENGTH
    with pytest.raises(ParameterError):
        parse_compile_params(text)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("optimizer='SGD(lr=1e309)'", r"'lr' must be a finite number"),
        ("optimizer='SGD(lr=nan)'", r"'lr' must be a finite number"),
        ("optimizer='SGD(lr=inf)'", r"'lr' must be a finite number"),
        ("optimizer='SGD(learning_rate=-1e309)'", r"'learning_rate' must be a finite number"),
        ("optimizer='SGD(lr=0)'", r"SGD.learning_rate.*positive"),
        ("optimizer='SGD(lr=-0.1)'", r"SGD.learning_rate.*positive"),
        ("optimizer='SGD(lr=\"0.1\")'", r"SGD.learning_rate.*positive"),
        ("optimizer='SGD(lr=True)'", r"SGD.learning_rate.*positive"),
        ("optimizer='SGD(momentum=1.5)'", r"SGD.momentum.*between 0 and 1"),
        ("optimizer='SGD(nesterov=\"True\")'", r"SGD.nesterov.*boolean"),
        ("optimizer='SGD(lr=0.1, learning_rate=0.2)'", r"'learning_rate' is given twice"),
        ("optimizer='SGD(lrate=0.1)'", r"Unknown optimizer argument 'lrate'"),
        ("optimizer='SGD(0.1)'", r"value without a name"),
        ("optimizer='Foo(lr=0.1)'", r"tf-keras optimizers"),
        ("optimizer='foo'", r"tf-keras optimizers"),
        ("optimizer='SGD(lr=0.1'", r"Invalid syntax"),
        ("optimizer='SGD(lr=0.1)(x=1)'", r"optimizer name followed by keyword"),
        ("optimizer=''", r"optimizer"),
        ("optimizer=1", r"optimizer"),
        ("loss_weights=[1e309]", r"'loss_weights' must be a finite number"),
    ],
)
def test_optimizer_and_number_checks(text, match):
    with pytest.raises(ParameterError, match=match):
        parse_compile_params(text)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("shuffle='False'", "shuffle"),
        ("shuffle='True'", "shuffle"),
        ("shuffle=0", "shuffle"),
        ("batch_size=0", "batch_size"),
        ("batch_size=-32", "batch_size"),
        ("batch_size=1.5", "batch_size"),
        ("batch_size=True", "batch_size"),
        ("batch_size='32'", "batch_size"),
        ("batch_size=None", "batch_size"),
        ("epochs=0", "epochs"),
        ("epochs=2**3", "epochs"),
        ("epochs=99999999999999999999999", "epochs"),
        ("verbose=3", "verbose"),
        ("verbose=True", "verbose"),
        ("verbose='auto'", "verbose"),
        ("steps_per_epoch=0", "steps_per_epoch"),
        ("validation_steps=-1", "validation_steps"),
        ("validation_freq=[1, 2]", "validation_freq"),
        ("initial_epoch=-1", "initial_epoch"),
        ("class_weight=[1, 2]", "class_weight"),
        ("class_weight={0: -1}", "class_weight"),
        ("class_weight={'a': 1}", "class_weight"),
        ("class_weight={0: 1, 0: 2}", "class_weight"),
    ],
)
def test_fit_type_checks_name_the_key(text, key):
    with pytest.raises(ParameterError) as info:
        parse_fit_params(text)
    assert repr(key) in str(info.value)
    assert "Received" in str(info.value)


def test_shuffle_string_error_says_what_to_write():
    with pytest.raises(ParameterError, match=r"write shuffle=False without quotes"):
        parse_fit_params("shuffle='False'")


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("loss=1", "loss"),
        ("loss=''", "loss"),
        ("loss=['mse']", "loss"),
        ("metrics='accuracy'", "metrics"),
        ("metrics=[1]", "metrics"),
        ("metrics=['']", "metrics"),
        ("weighted_metrics={'a': 1}", "weighted_metrics"),
        ("run_eagerly='yes'", "run_eagerly"),
        ("jit_compile=1", "jit_compile"),
        ("steps_per_execution=0", "steps_per_execution"),
        ("loss_weights='1'", "loss_weights"),
        ("loss_weights={1: 1}", "loss_weights"),
    ],
)
def test_compile_type_checks_name_the_key(text, key):
    with pytest.raises(ParameterError) as info:
        parse_compile_params(text)
    assert repr(key) in str(info.value)


def test_unknown_key_suggests_a_close_one():
    with pytest.raises(ParameterError, match=r"Unknown parameter 'btch_size'.*'batch_size'"):
        parse_fit_params("btch_size=32")
    with pytest.raises(ParameterError, match=r"Unknown parameter 'epochs'"):
        parse_compile_params("epochs=2")  # a fit key given to compile


def test_duplicate_key():
    with pytest.raises(ParameterError, match=r"'epochs' is given twice"):
        parse_fit_params("epochs=1, epochs=2")
    with pytest.raises(ParameterError, match="given twice"):
        parse_compile_params("loss_weights={'a': 1, 'a': 2}")


@pytest.mark.parametrize("key", ["sample_weight", "validation_data", "validation_split", "x", "y"])
def test_refused_fit_keys(key):
    with pytest.raises(ParameterError, match=rf"'{key}' is not accepted"):
        parse_fit_params(f"{key}=[]")


def test_callbacks_message_is_clear():
    with pytest.raises(ParameterError, match="dvml runs TensorBoard only"):
        parse_fit_params("callbacks=[EarlyStopping(patience=2)]")
    with pytest.raises(ParameterError, match="TensorBoard needs log_dir"):
        parse_fit_params("callbacks=[TensorBoard()]")
    with pytest.raises(ParameterError, match="TensorBoard has no argument 'logdir'"):
        parse_fit_params("callbacks=[TensorBoard(logdir='/x')]")


def test_errors_are_value_errors():
    with pytest.raises(ValueError):
        parse_fit_params("epochs=0")


# ----------------------------------------------------------------------------- format


ROUND_TRIPS = [
    "loss='categorical_crossentropy', optimizer='adam', metrics=['accuracy']",
    "loss='mse', optimizer='SGD(lr=0.01, momentum=0.9, nesterov=True)', metrics=[]",
    "optimizer='Adam(learning_rate=1e-05, beta_1=0.85, epsilon=1e-07)', run_eagerly=None",
    "loss=\"it's\", loss_weights={'a': -1.5, 'b': 2}, weighted_metrics=('mae',)",
    "optimizer='Adagrad()', jit_compile=False, steps_per_execution=8",
]


@pytest.mark.parametrize("text", ROUND_TRIPS)
def test_compile_round_trip(text):
    parsed = parse_compile_params(text)
    assert parse_compile_params(format_params(parsed)) == parsed


@pytest.mark.parametrize(
    "text",
    [
        "batch_size=32, epochs=2, verbose=0",
        "shuffle=True, class_weight={0: 1.0, 1: 0.25, 7: 3}, initial_epoch=3",
        "steps_per_epoch=None, validation_steps=10, validation_freq=5",
    ],
)
def test_fit_round_trip(text):
    parsed = parse_fit_params(text)
    assert parse_fit_params(format_params(parsed)) == parsed


def test_random_fit_round_trips():
    rng = random.Random(0)
    for _ in range(200):
        params = {
            "batch_size": rng.randint(1, 10_000),
            "epochs": rng.randint(1, 1000),
            "verbose": rng.choice([0, 1, 2]),
            "shuffle": rng.choice([True, False]),
            "class_weight": {i: rng.uniform(0, 10) for i in range(rng.randint(0, 5))},
        }
        keys = rng.sample(sorted(params), rng.randint(0, len(params)))
        subset = {key: params[key] for key in keys}
        assert parse_fit_params(format_params(subset)) == subset


def test_random_optimizer_round_trips():
    rng = random.Random(1)
    for _ in range(200):
        config = {"learning_rate": 10 ** rng.uniform(-8, 1), "momentum": rng.random()}
        parsed = {"optimizer": {"class_name": "SGD", "config": config}}
        assert parse_compile_params(format_params(parsed)) == parsed


def test_format_string_form():
    parsed = parse_compile_params("loss='mse', optimizer='SGD(lr=0.01)'")
    assert format_params(parsed) == "loss='mse', optimizer='SGD(learning_rate=0.01)'"
    assert format_params({}) == ""
    assert format_params({"t": (1,), "n": np.float32(0.5), "i": np.int64(3)}) == (
        "t=(1,), n=0.5, i=3"
    )


@pytest.mark.parametrize(
    "params",
    [
        {"loss": object()},
        {"callbacks": [print]},
        {"lr": math.nan},
        {"lr": math.inf},
        {"not an identifier": 1},
        {1: 1},
        {"optimizer": {"class_name": "Nope", "config": {}}},
    ],
)
def test_format_refuses(params):
    with pytest.raises(ParameterError):
        format_params(params)


def test_format_needs_a_mapping():
    with pytest.raises(ParameterError, match="must be a dict"):
        format_params("epochs=2")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- TensorFlow edge


def test_parsing_never_imports_tensorflow():
    code = (
        "import sys\n"
        "from dvml.train import params\n"
        "params.parse_compile_params(\"loss='mse', optimizer='SGD(lr=0.1)'\")\n"
        "params.format_params(params.parse_fit_params('epochs=1'))\n"
        "bad = [m for m in ('tensorflow', 'tf_keras', 'keras') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.tf
def test_compile_kwargs_compiles_a_tiny_model():
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras as keras

    def my_loss(y_true, y_pred):
        return keras.losses.mean_squared_error(y_true, y_pred)

    kwargs = compile_kwargs(
        "loss='my_loss', optimizer='SGD(lr=0.05, momentum=0.9)', metrics=['mae', 'my_loss']",
        custom_objects={"my_loss": my_loss},
    )
    assert kwargs["loss"] is my_loss
    assert kwargs["metrics"] == ["mae", my_loss]
    optimizer = kwargs["optimizer"]
    assert type(optimizer).__name__ == "SGD"
    assert float(optimizer.learning_rate) == pytest.approx(0.05)
    assert float(optimizer.momentum) == pytest.approx(0.9)

    model = keras.Sequential([keras.layers.Dense(1, input_shape=(3,))])
    model.compile(**kwargs)
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    history = model.fit(x, x.sum(axis=1), **parse_fit_params("batch_size=8, epochs=2, verbose=0"))
    assert len(history.history["loss"]) == 2

    assert type(build_optimizer("adam")).__name__ == "Adam"
    plain = compile_kwargs({"loss": "mse", "optimizer": "rmsprop"})
    assert type(plain["optimizer"]).__name__ == "RMSprop"
    with pytest.raises(ParameterError, match="argument 'momentum' for Adam"):
        build_optimizer("Adam(momentum=0.9)")


# ----------------------------------------------------------------------------- loss/metric objects


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "loss=CategoricalCrossentropy(from_logits=True)",
            {"class_name": "CategoricalCrossentropy", "config": {"from_logits": True}},
        ),
        (
            "loss='CategoricalCrossentropy(from_logits=True, label_smoothing=0.1)'",
            {
                "class_name": "CategoricalCrossentropy",
                "config": {"from_logits": True, "label_smoothing": 0.1},
            },
        ),
        (
            "loss=categoricalfocalcrossentropy(gamma=3, reduction='sum')",
            {
                "class_name": "CategoricalFocalCrossentropy",
                "config": {"gamma": 3, "reduction": "sum"},
            },
        ),
        ("loss=Huber()", {"class_name": "Huber", "config": {}}),
    ],
)
def test_loss_objects(text, expected):
    assert parse_compile_params(text)["loss"] == expected


def test_metric_objects_mixed_with_names_and_optimizer_call():
    parsed = parse_compile_params(
        "loss='categorical_crossentropy', optimizer=SGD(lr=0.01, momentum=0.9), "
        "metrics=['accuracy', AUC(name='auc', curve='PR'), 'TopKCategoricalAccuracy(k=3)'], "
        "weighted_metrics=[Precision(thresholds=[0.3, 0.7])]"
    )
    assert parsed["optimizer"] == {
        "class_name": "SGD",
        "config": {"learning_rate": 0.01, "momentum": 0.9},
    }
    assert parsed["metrics"] == [
        "accuracy",
        {"class_name": "AUC", "config": {"name": "auc", "curve": "PR"}},
        {"class_name": "TopKCategoricalAccuracy", "config": {"k": 3}},
    ]
    assert parsed["weighted_metrics"] == [
        {"class_name": "Precision", "config": {"thresholds": [0.3, 0.7]}}
    ]
    assert parse_compile_params(format_params(parsed)) == parsed
    assert format_params({"loss": parsed["metrics"][1]}) == "loss=AUC(name='auc', curve='PR')"


def test_dict_input_objects():
    parsed = parse_compile_params(
        {
            "loss": {"class_name": "CategoricalCrossentropy", "config": {"label_smoothing": 0.2}},
            "metrics": ["accuracy", "AUC(num_thresholds=50)"],
        }
    )
    assert parsed == {
        "loss": {"class_name": "CategoricalCrossentropy", "config": {"label_smoothing": 0.2}},
        "metrics": ["accuracy", {"class_name": "AUC", "config": {"num_thresholds": 50}}],
    }


OBJECT_ROUND_TRIPS = [
    "loss=CategoricalCrossentropy(label_smoothing=0.1), metrics=['accuracy']",
    "loss='BinaryFocalCrossentropy(apply_class_balancing=True, alpha=0.5)', optimizer='adam'",
    "metrics=[OneHotIoU(num_classes=3, target_class_ids=(0, 2)), F1Score(average=None)]",
    'loss=Huber(delta=2, name="it\'s"), weighted_metrics=[RecallAtPrecision(precision=0.8)]',
]


@pytest.mark.parametrize("text", OBJECT_ROUND_TRIPS)
def test_object_round_trip(text):
    parsed = parse_compile_params(text)
    formatted = format_params(parsed)
    assert parse_compile_params(formatted) == parsed
    assert format_params(parse_compile_params(formatted)) == formatted


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("loss=CategoricalCrossentropy(bogus=1)", r"has no argument 'bogus'.*accepts"),
        ("loss='CategoricalCrossentropy(from_logit=True)'", "Did you mean 'from_logits'"),
        ("loss=CategoricalCrossentropy(from_logits='True')", "from_logits.*boolean"),
        ("loss=CategoricalCrossentropy(label_smoothing=2)", "label_smoothing.*between 0 and 1"),
        ("loss=CategoricalCrossentropy(reduction='mean')", "one of"),
        ("loss=CategoricalCrossentropy(0.1)", "positional"),
        ("loss=CategoricalCrossentropy(**{'a': 1})", "positional or \\*\\*"),
        ("loss=CategoricalCrossentropy(label_smoothing=abs(1))", "Call"),
        ("loss=keras.losses.Huber()", "Call"),
        (
            "loss=CategoricalCrossentopy()",
            "Unknown loss class.*Did you mean CategoricalCrossentropy",
        ),
        ("loss=AUC()", "Unknown loss class 'AUC'"),
        ("metrics=[Huber()]", "Unknown metric class 'Huber'"),
        ("metrics=[AUC(curve='roc')]", "one of \\['ROC', 'PR'\\]"),
        ("metrics=[AUC(num_thresholds=1)]", "num_thresholds.*>= 2"),
        ("metrics=[AUC(num_labels=2)]", "only with multi_label=True"),
        ("metrics=[PrecisionAtRecall()]", r"needs the argument\(s\) \['recall'\]"),
        ("metrics=AUC()", "'metrics' must be a list"),
        ("optimizer=SGD(lr=-1)", "learning_rate"),
        # each optimizer's own arguments: tf-keras' Adam has no momentum, SGD no beta_1
        ("optimizer='Adam(momentum=0.9)'", r"argument 'momentum' for Adam.*Adam accepts"),
        ("optimizer=SGD(beta_1=0.9)", "argument 'beta_1' for SGD"),
        ("optimizer=Adafactor(epsilon=1e-3)", "Did you mean 'epsilon_"),
        ("optimizer=SGD(clipnorm=1, global_clipnorm=1)", "both clipnorm and global_clipnorm"),
        ("optimizer=Nope(lr=1)", "optimizer"),
        ("batch_size=Foo()", "positive integer. Received: batch_size=Foo()"),
        ("loss_weights=[Foo()]", "loss_weights"),
        ("run_eagerly=Foo()", "run_eagerly"),
    ],
)
def test_object_errors(text, match):
    with pytest.raises(ParameterError, match=match):
        (parse_fit_params if text.startswith("batch") else parse_compile_params)(text)


@pytest.mark.parametrize(
    ("text", "use"),
    [
        ("loss='sparse_categorical_crossentropy'", "categorical_crossentropy"),
        ("loss=SparseCategoricalCrossentropy(from_logits=True)", "CategoricalCrossentropy"),
        ("loss='SparseCategoricalCrossentropy()'", "CategoricalCrossentropy"),
        ("metrics=['sparse_categorical_accuracy']", "categorical_accuracy"),
        ("metrics=[SparseTopKCategoricalAccuracy(k=2)]", "TopKCategoricalAccuracy"),
        ("metrics=[MeanIoU(num_classes=3)]", "OneHotMeanIoU"),
    ],
)
def test_sparse_losses_and_metrics_are_refused_with_the_one_hot_one(text, use):
    with pytest.raises(ParameterError, match=f"labels are one-hot.*Use {use} instead"):
        parse_compile_params(text)


def test_custom_names_make_plain_names_strict():
    text = "loss='my_loss', metrics=['accuracy', 'my_metric']"
    assert parse_compile_params(text)["loss"] == "my_loss"  # no names given: any name
    parsed = parse_compile_params(text, custom_names=["my_loss", "my_metric"])
    assert parsed == {"loss": "my_loss", "metrics": ["accuracy", "my_metric"]}
    with pytest.raises(ParameterError, match=r"Unknown metric 'my_metric'.*custom_objects"):
        parse_compile_params(text, custom_names=["my_loss"])
    with pytest.raises(ParameterError, match="Did you mean 'categorical_crossentropy'"):
        parse_compile_params("loss='categorical_crossentropie'", custom_names=[])
    for name in ("mse", "categorical_crossentropy", "CategoricalCrossentropy", "huber"):
        assert parse_compile_params({"loss": name}, custom_names=[])["loss"] == name
    for name in ("acc", "accuracy", "ce", "AUC", "top_k_categorical_accuracy"):
        assert parse_compile_params({"metrics": [name]}, custom_names=[])["metrics"] == [name]


def test_reported_names_follow_keras():
    from dvml.configs import reported_name
    from dvml.train.summary import metric_names

    parsed = parse_compile_params(
        "loss=CategoricalCrossentropy(label_smoothing=0.1), "
        "metrics=['accuracy', AUC(), Precision(name='p'), TopKCategoricalAccuracy(k=2)]"
    )
    assert [reported_name(m) for m in parsed["metrics"]] == [
        "accuracy",
        "auc",
        "p",
        "top_k_categorical_accuracy",
    ]
    metrics, loss = metric_names(parsed)
    assert metrics[1] == "auc" and loss == "CategoricalCrossentropy(label_smoothing=0.1)"


@pytest.mark.tf
def test_compile_kwargs_builds_loss_and_metric_objects():
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras as keras

    kwargs = compile_kwargs(
        "loss=CategoricalCrossentropy(label_smoothing=0.1, from_logits=True), optimizer='adam', "
        "metrics=['accuracy', AUC(name='auc'), TopKCategoricalAccuracy(k=2)]"
    )
    loss = kwargs["loss"]
    assert isinstance(loss, keras.losses.CategoricalCrossentropy)
    assert loss.get_config()["label_smoothing"] == pytest.approx(0.1)
    assert loss.get_config()["from_logits"] is True
    assert kwargs["metrics"][0] == "accuracy"
    assert (
        isinstance(kwargs["metrics"][1], keras.metrics.AUC) and kwargs["metrics"][1].name == "auc"
    )
    assert kwargs["metrics"][2].get_config()["k"] == 2

    model = keras.Sequential([keras.layers.Dense(3, input_shape=(4,))])
    model.compile(**kwargs)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 4)).astype("float32")
    y = np.eye(3, dtype="float32")[rng.integers(0, 3, 32)]
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert {"loss", "accuracy", "auc", "top_k_categorical_accuracy"} <= set(history.history)
