package agentvm

import (
	"strings"
	"testing"
)

// TestTailBuffer: the buffer keeps exactly the last Max bytes, whatever
// the sizes of the writes.
func TestTailBuffer(t *testing.T) {
	tb := &TailBuffer{Max: 10}
	var all strings.Builder
	for i := 0; i < 100; i++ {
		s := strings.Repeat(string(rune('a'+i%26)), i%7)
		tb.Write([]byte(s))
		all.WriteString(s)
		want := all.String()
		if len(want) > 10 {
			want = want[len(want)-10:]
		}
		if got := tb.String(); got != want {
			t.Fatalf("after %d writes: %q, want %q", i+1, got, want)
		}
	}
	if len(tb.b) > 20 {
		t.Errorf("holds %d bytes, want at most 2*Max", len(tb.b))
	}
}
