import numpy as np

from kformer.model import masks


def test_padding_mask_marks_non_pad_keys():
    ids = np.array([[5, 6, 0], [7, 0, 0]], "int32")
    np.testing.assert_array_equal(
        np.asarray(masks.padding_mask(ids)), [[[True, True, False]], [[True, False, False]]]
    )


def test_causal_mask_and_offset():
    np.testing.assert_array_equal(np.asarray(masks.causal_mask(3))[0], np.tril(np.ones((3, 3), bool)))
    # One query at step 2 over a 5-slot buffer sees keys 0..2.
    np.testing.assert_array_equal(
        np.asarray(masks.causal_mask(1, 5, offset=2))[0], [[True, True, True, False, False]]
    )


def test_combine_ignores_none_and_ands():
    a = np.array([[True, False]])
    b = np.array([[True, True]])
    np.testing.assert_array_equal(np.asarray(masks.combine(a, None, b)), [[True, False]])
    assert masks.combine(None) is None
