package namedvm

import (
	"errors"
	"testing"

	"github.com/microvm/microvm/internal/vms"
)

// TestRemove: Remove takes every VM it can out of the state directory and
// joins the errors of those it cannot: an unknown name, a running VM
// without force.
func TestRemove(t *testing.T) {
	store := testStore(t)
	for _, name := range []string{"gone", "up"} {
		l, err := store.Create(vms.Record{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		if name == "gone" {
			l.Release()
		} else {
			t.Cleanup(func() { l.Release() })
		}
	}
	err := Remove([]string{"gone", "nope", "up"}, false)
	if !errors.Is(err, vms.ErrNotFound) || !errors.Is(err, vms.ErrRunning) {
		t.Errorf("Remove: %v; want not found and running", err)
	}
	if _, err := store.Get("gone"); !errors.Is(err, vms.ErrNotFound) {
		t.Errorf("the exited VM: %v; want it removed", err)
	}
	if e, err := store.Get("up"); err != nil || !e.Alive {
		t.Errorf("the running VM: %+v, %v; want it kept", e, err)
	}
	if err := Remove(nil, false); err != nil {
		t.Errorf("no names: %v", err)
	}
}
