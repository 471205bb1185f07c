package namedvm

import (
	"testing"

	"github.com/microvm/microvm/internal/vms"
)

// testStore is the store of an empty state directory of the test's own,
// which the package's lookups find through $MICROVM_STATE_DIR.
func testStore(t *testing.T) *vms.Store {
	t.Helper()
	state := t.TempDir()
	t.Setenv("MICROVM_STATE_DIR", state)
	store, err := vms.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	return store
}
