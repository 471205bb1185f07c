package agentvm

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/status"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
)

// End says how the VM ended, for messages: its exit kind, the status the
// guest chose when it chose one, and the VMM's error (Run's) when there
// was one.
func End(res microvm.Result, err error) string {
	s := res.Kind.String()
	if res.Kind == microvm.ExitDebugPort || res.Kind == microvm.ExitTripleFault {
		s += fmt.Sprintf(", status %d", res.Status)
	}
	if err != nil {
		s += ": " + err.Error()
	}
	return s
}

// ErrVMEnded: the VM stopped before the command's exit status came.
var ErrVMEnded = errors.New("the VM ended")

// ShellStatus is a process's end as a shell tells it: its exit code, or
// 128+N for signal N.
func ShellStatus(st *agentapi.ExitStatus) int {
	if st.Signal != 0 {
		return 128 + int(st.Signal)
	}
	return int(st.Code)
}

// Message is an agent call's error as a user reads it: the agent's own
// message for a gRPC status ("the agent: exec: 64 processes already
// running"), without gRPC's "rpc error: code = ... desc =" wrapping.
func Message(err error) string {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return err.Error()
	}
	msg := se.GRPCStatus().Message()
	if m, ok := strings.CutPrefix(msg, "agent: "); ok {
		return "the agent: " + m
	}
	return msg
}
