package virtio9p

import "github.com/hugelgupf/p9/p9"

// WrapAttacher has the device's 9P connections serve wrap(share) instead
// of the share itself: tests hold requests in the server with it, or
// count the files it closes. Call before the first activation.
func WrapAttacher(d *Device, wrap func(p9.Attacher) p9.Attacher) {
	d.attacher = wrap(d.attacher)
}

// Draining returns a channel closed once the running session's Drain has
// seen its request loop end (nothing more is popped; what is in flight
// still goes back), or nil when no session runs. Take it before Quiesce.
func Draining(d *Device) <-chan struct{} {
	s, ok := d.life.Current()
	if !ok {
		return nil
	}
	return s.drain
}
