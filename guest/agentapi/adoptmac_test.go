package agentapi

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// macAgent is an agent whose SetMAC records each request and refuses an
// old address it does not know.
type macAgent struct {
	UnimplementedAgentServer
	known map[string]bool
	got   chan string
}

func (a macAgent) SetMAC(ctx context.Context, r *SetMACRequest) (*SetMACResponse, error) {
	old, mac := net.HardwareAddr(r.GetOld()), net.HardwareAddr(r.GetMac())
	a.got <- fmt.Sprintf("%v>%v", old, mac)
	if !a.known[old.String()] {
		return nil, status.Errorf(codes.NotFound, "no interface has address %v", old)
	}
	return &SetMACResponse{Interface: "eth0"}, nil
}

// fakeAdopter is a MACAdopter with a fixed list of changes, applied as
// Machine.AdoptMACs does: in order, up to the first error.
type fakeAdopter struct{ old, mac []net.HardwareAddr }

func (f fakeAdopter) AdoptMACs(ctx context.Context, set func(ctx context.Context, old, mac net.HardwareAddr) error) error {
	for i := range f.old {
		if err := set(ctx, f.old[i], f.mac[i]); err != nil {
			return fmt.Errorf("network device %d: %w", i, err)
		}
	}
	return nil
}

// TestAdoptMACs: AdoptMACs hands the agent each of the machine's changes
// through SetMAC, and the agent's refusal comes back through the machine's
// error.
func TestAdoptMACs(t *testing.T) {
	agent := macAgent{known: map[string]bool{"02:00:00:00:00:01": true}, got: make(chan string, 8)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc := serveFakeAgent(ctx, t, agent)

	mac := func(b byte) net.HardwareAddr { return net.HardwareAddr{0x02, 0, 0, 0, 0, b} }
	vm := fakeAdopter{old: []net.HardwareAddr{mac(1), mac(2)}, mac: []net.HardwareAddr{mac(0x11), mac(0x12)}}
	err := AdoptMACs(ctx, vm, cc)
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "network device 1") {
		t.Errorf("AdoptMACs with an address the agent does not know: %v; want its NotFound through the machine's error", err)
	}
	close(agent.got)
	var got []string
	for s := range agent.got {
		got = append(got, s)
	}
	if want := "[02:00:00:00:00:01>02:00:00:00:00:11 02:00:00:00:00:02>02:00:00:00:00:12]"; fmt.Sprint(got) != want {
		t.Errorf("the agent was asked %v; want %v", got, want)
	}
	if err := AdoptMACs(ctx, fakeAdopter{}, cc); err != nil {
		t.Errorf("AdoptMACs with no changes: %v", err)
	}
}
