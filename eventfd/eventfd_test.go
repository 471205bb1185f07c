package eventfd

import "testing"

func TestSignalWait(t *testing.T) {
	e, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for i := 0; i < 3; i++ {
		if err := e.Signal(); err != nil {
			t.Fatal(err)
		}
	}
	n, err := e.Wait()
	if err != nil || n != 3 {
		t.Fatalf("Wait = %d, %v; want 3", n, err)
	}
	nb, err := NewNonblocking()
	if err != nil {
		t.Fatal(err)
	}
	defer nb.Close()
	if n, err := nb.Wait(); n != 0 || err != nil {
		t.Fatalf("empty non-blocking Wait = %d, %v", n, err)
	}
}
