"""What every test shares, whatever its folder (the folders' own conftests hold their fixtures)."""

import pytest

# The typed helpers check what they narrow with `assert`; rewritten, a failure shows the value it got.
pytest.register_assert_rewrite("tests.typed")
