package devices_test

import (
	"os"
	"testing"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// TestMain keeps a dying fuzzing worker's output (scripts/fuzz).
func TestMain(m *testing.M) {
	testenv.CaptureFuzzWorkerOutput()
	os.Exit(m.Run())
}
