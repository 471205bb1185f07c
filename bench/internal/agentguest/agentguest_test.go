package agentguest

import "testing"

func TestEnded(t *testing.T) {
	done := make(chan struct{})
	if Ended(done) {
		t.Error("Ended before close: true")
	}
	close(done)
	if !Ended(done) {
		t.Error("Ended after close: false")
	}
}
