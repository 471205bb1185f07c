package testenv

import "testing"

// FakeTB is a testing.TB for running a check whose failure is the expected
// outcome, or one to retry: it records failures, which Failed reports,
// instead of failing the test, and its Fatalf ends the check with a panic
// for the caller to recover. Its other methods are the nil embedded TB's,
// so the check may call only Helper, Errorf, Fatalf and Failed.
type FakeTB struct {
	testing.TB
	failed bool
}

// Helper does nothing.
func (f *FakeTB) Helper() {}

// Errorf records a failure.
func (f *FakeTB) Errorf(string, ...any) { f.failed = true }

// Fatalf records a failure and panics.
func (f *FakeTB) Fatalf(string, ...any) { f.failed = true; panic("fatal") }

// Failed says whether the check failed.
func (f *FakeTB) Failed() bool { return f.failed }
