// Package hwtest holds the Ascend hardware tests: built with -tags ascend,
// they run when K3_ASCEND_DEVICE names an NPU index (CANN found through
// LD_LIBRARY_PATH or K3_ASCEND_LIB_DIRS) and skip otherwise.
// K3_ASCEND_DEVICE=fake runs them against the fake CANN of the driver's
// tests instead, which keeps the tests themselves honest in CI; what they
// prove about the real libraries comes only from a run on an NPU.
//
// They live in their own package because a process loads CANN once: the
// driver's own tests load the fake.
package hwtest
