package microvm

// Waiting for a guest's agent: Machine.WaitAgent dials a guest port over
// the in-process vsock API until something there accepts, the time given
// passes or the machine's run ends, and when it gives up says how far the
// guest got. The agent's wire API (guest/agentapi, gRPC) wraps the
// connection; the root package returns a net.Conn so that a program that
// does not talk to an agent does not link gRPC.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/microvm/microvm/vsock"
)

// agentRetryInterval is how long WaitAgent waits after a refused dial
// before the next. A refused dial is cheap (a REQUEST and an RST in the
// guest), and a boot-time measurement should not be rounded up by much.
const agentRetryInterval = 10 * time.Millisecond

// agentPeekTimeout bounds how long a failed WaitAgent waits for the vCPUs
// to say where they stand.
const agentPeekTimeout = 2 * time.Second

// WaitAgent returns a connection to guest port port (the guest agent's,
// agentapi.DefaultPort, or any other guest service's) once the guest
// accepts one: until then (the guest still booting: its driver not up,
// the port refused) it dials again every 10 ms. It gives up when timeout
// passes (timeout <= 0: only ctx bounds the wait), when ctx ends, or when
// the machine's run ends, whichever comes first; call it while Run runs
// on another goroutine.
//
// Errors: one wrapping ErrStopped when the machine stopped before the
// guest accepted (Run returned or is returning: its Result says how the
// guest ended); ErrNoVsock without a vsock device. Otherwise (timeout,
// ctx, a dial error retrying cannot fix) the error wraps the last dial's
// and ends with two bracketed parts that tell how far the guest got: the
// vsock device's counters (whether the guest's driver ever took a
// request, refused it or never answered), then each virtio device's
// status byte (DeviceStatuses) and where each vCPU stands (PeekVCPUs), so
// that a guest that hung while booting shows where. docs/debugging.md
// reads them.
//
// agentapi.ConnectVM wraps WaitAgent's connection as a gRPC client of
// the agent.
func (m *Machine) WaitAgent(ctx context.Context, port uint32, timeout time.Duration) (net.Conn, error) {
	w := agentWait{
		dial:   m.DialVsock,
		ended:  m.runEnded,
		report: m.agentReport,
	}
	return w.wait(ctx, port, timeout)
}

// agentWait is what WaitAgent needs of a Machine, so that its retries,
// time limit and messages can be tested without a guest.
type agentWait struct {
	dial   func(ctx context.Context, port uint32) (net.Conn, error)
	ended  <-chan struct{} // closed when the machine's Run has returned; nil: never
	report func() string   // how far the guest got, for a failure
}

// wait is WaitAgent.
func (w agentWait) wait(ctx context.Context, port uint32, timeout time.Duration) (net.Conn, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, timeout,
			fmt.Errorf("the guest agent did not answer on vsock port %d within %v", port, timeout))
		defer cancel()
	}
	stopped := func() (net.Conn, error) {
		return nil, fmt.Errorf("microvm: the machine stopped before its guest accepted on vsock port %d: %w", port, ErrStopped)
	}
	var t *time.Timer // the back-off between dials, made at the first refusal
	for {
		select {
		case <-w.ended:
			return stopped()
		default:
		}
		c, err := w.dial(ctx, port)
		if err == nil {
			return c, nil
		}
		switch {
		case errors.Is(err, ErrStopped):
			return stopped()
		case errors.Is(err, ErrNoVsock):
			return nil, err
		case ctx.Err() != nil:
			return nil, w.failed(ctx, err)
		case !errors.Is(err, ErrVsockRefused):
			if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
				// The dial timed out a moment before ctx's own timer
				// fired: wait for it, to report ctx's cause.
				<-ctx.Done()
				return nil, w.failed(ctx, err)
			}
			return nil, fmt.Errorf("microvm: %w [%s]", err, w.report())
		}
		if t == nil {
			t = time.NewTimer(agentRetryInterval)
			defer t.Stop()
		} else {
			t.Reset(agentRetryInterval)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, w.failed(ctx, err)
		case <-w.ended:
			return stopped()
		}
	}
}

// failed is the error for a wait whose ctx ended: its cause (the timeout,
// or the caller's), the last dial's error, and the guest's state.
func (w agentWait) failed(ctx context.Context, last error) error {
	return fmt.Errorf("microvm: %w (last try: %w) [%s]", context.Cause(ctx), last, w.report())
}

// agentReport is how far the guest got, for a WaitAgent that gave up:
// the vsock device's counters, then each virtio device's status byte and
// each vCPU's instruction pointer, flags and run state (halted or
// runnable), joined as "vsock device: ...] [virtio devices: ...". An
// instruction pointer in the guest kernel names, with its System.map, the
// function a hung boot is in.
func (m *Machine) agentReport() string {
	ctx, cancel := context.WithTimeout(context.Background(), agentPeekTimeout)
	defer cancel()
	var b strings.Builder
	b.WriteString(vsockBrief(m.VsockStats()))
	fmt.Fprintf(&b, "] [virtio devices: %s; ", m.DeviceStatuses())
	vcpus, err := m.PeekVCPUs(ctx)
	for i, v := range vcpus {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(v.String())
	}
	if err != nil {
		if len(vcpus) > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "vCPUs: %v", err)
	}
	return b.String()
}

// vsockBrief is the part of the vsock device's counters that tells a
// connection that was never answered from one the guest refused.
func vsockBrief(st vsock.Stats) string {
	return fmt.Sprintf("vsock device: %d connections opened, %d refused, %d open; %d packets from the guest, %d to it; "+
		"%d TX kicks, %d RX kicks, %d RX interrupts, %d passes without RX buffers, %d guest errors",
		st.ConnsOpened, st.ConnsRefused, st.ConnsOpen, st.TxPackets, st.RxPackets,
		st.TxKicks, st.RxKicks, st.Interrupts, st.RxQueueFull, st.GuestErrors)
}
