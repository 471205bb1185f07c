package agentvm

import "sync"

// TailBuffer keeps the last Max bytes written to it: a guest console's
// end, shown when the agent never answers or the VM ends.
type TailBuffer struct {
	Max int

	mu sync.Mutex // guards b
	b  []byte
}

func (t *TailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	// Trim only once twice the limit is held, so the copy is amortised
	// over at least Max bytes of writes instead of paid on every one.
	if len(t.b) > 2*t.Max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.Max:]...)
	}
	return len(p), nil
}

func (t *TailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b[max(0, len(t.b)-t.Max):])
}
