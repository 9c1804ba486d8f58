"""One shared check for every kformer layer, in the spirit of keras-hub's run_layer_test:
config round trip, symbolic and eager call agree on shape, and .keras save/load equality.
Layers that return (output, extras) are checked on their output."""

import keras
import numpy as np


def _output(result):
    return result[0] if isinstance(result, tuple) else result


def run_layer_test(layer_cls, init_kwargs, call_args, call_kwargs=None, tmp_path=None):
    call_kwargs = call_kwargs or {}
    layer = layer_cls(**init_kwargs)
    eager = _output(layer(*call_args, **call_kwargs))

    # Config round trip: every constructor argument is stored under the same name.
    config = layer.get_config()
    for name, value in init_kwargs.items():
        assert config[name] == value, f"{layer_cls.__name__}.get_config()[{name!r}]"
    clone = layer_cls.from_config(config)
    clone(*call_args, **call_kwargs)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(
        np.asarray(_output(clone(*call_args, **call_kwargs))), np.asarray(eager), atol=1e-6
    )

    # Symbolic call: same output shape as eager (dynamic batch/length).
    symbolic_args = [
        keras.Input(shape=np.shape(a)[1:], dtype=keras.backend.standardize_dtype(a.dtype)) for a in call_args
    ]
    symbolic = _output(layer(*symbolic_args, **call_kwargs))
    assert tuple(symbolic.shape[1:]) == tuple(np.shape(eager)[1:])

    # .keras save/load inside a model.
    if tmp_path is not None:
        model = keras.Model(symbolic_args, symbolic)
        path = str(tmp_path / f"{layer_cls.__name__}.keras")
        model.save(path)
        restored = keras.saving.load_model(path)  # safe_mode stays on
        np.testing.assert_allclose(
            np.asarray(restored(list(call_args))), np.asarray(model(list(call_args))), atol=1e-6
        )
    return eager
