package namedvm

import (
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/vms"
)

// TestAgent: Agent refuses a VM that does not run or runs no agent, and
// gives a running one's agent address in its state directory.
func TestAgent(t *testing.T) {
	store := testStore(t)
	for _, rec := range []vms.Record{{Name: "plain"}, {Name: "withagent", Agent: true, AgentPort: agentvm.Port}} {
		l, err := store.Create(rec)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Release() })
	}
	if _, err := Agent("nope", time.Second); err == nil {
		t.Error("an unknown VM: no error")
	}
	if _, err := Agent("plain", time.Second); err == nil || err.Error() != "VM plain runs no agent (start it with --with-agent)" {
		t.Errorf("a VM without an agent: %v", err)
	}
	a, err := Agent("withagent", 3*time.Second)
	if err != nil || a.Port != agentvm.Port || a.Timeout != 3*time.Second || !strings.HasSuffix(a.UDS, "/withagent/"+vms.VsockSocket) {
		t.Errorf("a VM with an agent: %+v, %v", a, err)
	}
}
