package vhostuservsock

import (
	"github.com/microvm/microvm"
	"github.com/microvm/microvm/virtio/vhostuser"
	"github.com/microvm/microvm/vsock"
)

// metrics is a snapshot of the back-end's counters: the device's (named
// vsock0, as a VM's first vsock device) and the vhost-user back-end's.
func metrics(dev *vsock.Device, dgram bool, be *vhostuser.Backend) microvm.VhostUserVsockMetrics {
	m := microvm.VhostUserVsockMetrics{Vsock: microvm.VsockMetrics{Name: "vsock0", Dgram: dgram, Stats: dev.Stats()}}
	m.Frontends, m.FrontendErrors, m.DeviceFailures = be.Stats()
	return m
}
