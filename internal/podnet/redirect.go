package podnet

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Redirect joins the TAP named tap to the pod's interface ifc, both in the
// namespace at nsPath: the TAP is brought up with the interface's MTU, and
// every frame that enters either one leaves by the other (tc: an ingress
// qdisc, a u32 filter matching everything, a mirred egress redirect).
func Redirect(nsPath string, ifc Interface, tap string) error {
	h, err := handle(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	pod, err := h.LinkByName(ifc.Name)
	if err != nil {
		return fmt.Errorf("podnet: %s in %s: %w", ifc.Name, nsPath, err)
	}
	t, err := h.LinkByName(tap)
	if err != nil {
		return fmt.Errorf("podnet: TAP %s in %s: %w", tap, nsPath, err)
	}
	if ifc.MTU > 0 {
		if err := h.LinkSetMTU(t, ifc.MTU); err != nil {
			return fmt.Errorf("podnet: MTU %d on TAP %s: %w", ifc.MTU, tap, err)
		}
	}
	if err := h.LinkSetUp(t); err != nil {
		return fmt.Errorf("podnet: TAP %s up: %w", tap, err)
	}
	if err := redirectIngress(h, pod, t); err != nil {
		return fmt.Errorf("podnet: %s to %s in %s: %w", ifc.Name, tap, nsPath, err)
	}
	if err := redirectIngress(h, t, pod); err != nil {
		return fmt.Errorf("podnet: %s to %s in %s: %w", tap, ifc.Name, nsPath, err)
	}
	return nil
}

// redirectIngress sends every frame that enters from out of to.
func redirectIngress(h *netlink.Handle, from, to netlink.Link) error {
	ingress := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: from.Attrs().Index,
		Handle:    netlink.MakeHandle(0xffff, 0),
		Parent:    netlink.HANDLE_INGRESS,
	}}
	// Added, not replaced: the kernel refuses to replace an ingress
	// qdisc, and one that is there already (a retried set-up) is ours.
	if err := h.QdiscAdd(ingress); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("ingress qdisc on %s: %w", from.Attrs().Name, err)
	}
	f := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: from.Attrs().Index,
			Parent:    netlink.MakeHandle(0xffff, 0),
			Priority:  1,
			Protocol:  unix.ETH_P_ALL,
		},
		// Sel nil: one key that matches every frame.
		Actions: []netlink.Action{netlink.NewMirredAction(to.Attrs().Index)},
	}
	if err := h.FilterReplace(f); err != nil {
		return fmt.Errorf("u32 redirect filter on %s: %w", from.Attrs().Name, err)
	}
	return nil
}
