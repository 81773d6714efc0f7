"""A stand-in for the `expecttest` package, which Debian does not ship.

torch.testing._internal.common_utils imports it for `expecttest.TestCase` (the
base of torch's TestCase) and `expecttest.ACCEPT`. The distributed suite never
uses expect-files, so plain unittest.TestCase plus an inline assertion that
compares text (no accept mode) is enough.
"""
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    longMessage = True

    def assertExpectedInline(self, actual, expect, skip=0):  # noqa: N802 - expecttest's name
        self.assertMultiLineEqual(str(expect).strip(), str(actual).strip())

    def assertExpectedRaisesInline(self, exc_type, callable, expect, *args, **kwargs):  # noqa: N802
        with self.assertRaises(exc_type) as cm:
            callable(*args, **kwargs)
        self.assertExpectedInline(str(cm.exception), expect)
