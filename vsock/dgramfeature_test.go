package vsock_test

import (
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// The datagram worker kept the guest's kicks off during its passes whatever
// Options.KickSuppress said (kick-suppress=off did not reach it). The
// guest's used ring shows it: VIRTQ_USED_F_NO_NOTIFY while a pass runs.
func TestDgramKickSuppressFollowsOption(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("kick-suppress=%v", on), func(t *testing.T) {
			uds := filepath.Join(t.TempDir(), "v")
			opts := vsock.DefaultOptions
			opts.KickSuppress = on
			e := newEnv(t, envOpts{cfg: vsock.Config{Dgram: true, DgramUDS: uds, Options: &opts},
				guest: vsocktest.Options{Dgram: true}})
			used := e.g.DTX.Cfg.Used
			mem := e.g.Mem
			var batches, off atomic.Int64
			e.dev.SetBatchHooks(nil, func() {
				batches.Add(1)
				if flags, err := mem.Load16Acquire(used); err == nil && flags&1 != 0 {
					off.Add(1)
				}
			})
			for i := 0; i < 4; i++ {
				e.g.SendDgram(1024, 7000, []byte("to nobody"))
				e.g.SyncDgram()
			}
			spinUntil(t, "datagram passes", func() bool { return batches.Load() >= 4 })
			if got := off.Load() > 0; got != on {
				t.Errorf("kicks disabled during %d of %d datagram passes; want them disabled: %v", off.Load(), batches.Load(), on)
			}
		})
	}
}

// Datagrams are microvm's own: a device with Config.Dgram offers
// FeatureDgram (bit 23) and never VIRTIO_VSOCK_F_DGRAM (bit 3), whose
// datagrams share the stream queues in the RFC series.
func TestDgramFeatureIsMicrovmOnly(t *testing.T) {
	dev, err := vsock.New(vsock.Config{CID: 3, Log: quietLog(), Dgram: true, DgramUDS: filepath.Join(t.TempDir(), "v")})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	const rfcDgram = 1 << 3
	if f := dev.Features(); f&rfcDgram != 0 || f&vsock.FeatureDgram == 0 || vsock.FeatureDgram != 1<<23 {
		t.Errorf("features %#x (FeatureDgram %#x); want bit 23 and not bit 3", f, uint64(vsock.FeatureDgram))
	}
}
