package agentvm

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/microvm/microvm"
)

// TestEnd: how exec tells a VM's end; regression: "<nil>" appeared when
// the VM ended without an error.
func TestEnd(t *testing.T) {
	for _, tc := range []struct {
		res  microvm.Result
		err  error
		want string
	}{
		{microvm.Result{Kind: microvm.ExitReset}, nil, "reset"},
		{microvm.Result{Kind: microvm.ExitPowerOff}, nil, "power-off"},
		{microvm.Result{Kind: microvm.ExitTripleFault, Status: 125}, nil, "triple-fault, status 125"},
		{microvm.Result{Kind: microvm.ExitDebugPort, Status: 3}, nil, "debug-exit, status 3"},
		{microvm.Result{Kind: microvm.ExitError, Status: 1}, errors.New("kvm: run: bad"), "error: kvm: run: bad"},
	} {
		if got := End(tc.res, tc.err); got != tc.want || strings.Contains(got, "<nil>") {
			t.Errorf("End(%+v, %v) = %q, want %q", tc.res, tc.err, got, tc.want)
		}
	}
}

// TestMessage: an agent call's error reads as the agent's own message,
// never as gRPC's "rpc error: code = ... desc = ...".
func TestMessage(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{status.Error(codes.ResourceExhausted, "agent: exec: 64 processes already running"), "the agent: exec: 64 processes already running"},
		{status.Error(codes.Unavailable, "connection reset"), "connection reset"},
		{errors.New("plain"), "plain"},
	} {
		got := Message(tc.err)
		if got != tc.want || strings.Contains(got, "rpc error") {
			t.Errorf("Message(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
