package containerdshim

import (
	"time"

	"github.com/sirupsen/logrus"
)

// createPhases is where a Create's time went, logged once per container
// (containerd copies the shim's log into its own), so an operator sees
// what a pod start costs and make bench-containerd can split its start
// figure: the snapshot mounted, the ext4 built from it (the pod's first
// container, ext4 method), the VM booted until its agent answered (the
// pod's first container), the root streamed into the running guest (later
// containers, ext4) or bound into the pod's shared directory (9p), the
// volumes bound and copied.
type createPhases struct {
	mount, ext4, boot, copy, volumes time.Duration
}

// mark sets *d to the time since *since and moves *since to now.
func (p *createPhases) mark(d *time.Duration, since *time.Time) {
	now := time.Now()
	*d = now.Sub(*since)
	*since = now
}

// log writes the phases as one line with a field per phase in ms.
func (p *createPhases) log(l logrus.FieldLogger) {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	l.WithFields(logrus.Fields{
		"mount_ms": ms(p.mount), "ext4_ms": ms(p.ext4), "boot_ms": ms(p.boot),
		"copy_ms": ms(p.copy), "volumes_ms": ms(p.volumes),
	}).Info(createPhasesMsg)
}

// createPhasesMsg is the message of the phases' log line.
const createPhasesMsg = "microvm create phases"
