// fixtures_link.cpp -- the seeded synthetic layers and steps of the test fixtures
// (test::random_layer, test::random_step) linked into k4_device for its bench and check.
#include "tests/cpu/fixtures.cpp"  // NOLINT(bugprone-suspicious-include)
