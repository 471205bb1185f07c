package clibase

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/jail"
	"github.com/microvm/microvm/internal/seccomp"
)

// OwnsProcess says that the binary's Main runs as the process's own
// program (its main, or the test binary acting as the CLI), so it may
// confine the whole process; each main sets it. Main called from inside
// another program (the binary's in-process tests) never installs the filter: it would stay on that program for the rest
// of its life.
var OwnsProcess bool

// AfterConfine, when set (only by tests), runs right after the filter is
// installed: TestSeccompForbiddenCall makes a forbidden call there.
var AfterConfine func()

// SeccompHint ends the report of a forbidden call.
const SeccompHint = "--seccomp=off runs without the filter; docs/security.md"

// SeccompFlag is --seccomp, on by default, for the commands that run a
// device: run, exec, vhost-user-vsock.
func SeccompFlag() Opt {
	return ValueOpt("seccomp", &onOff{on: true}, "on",
		"confine microvm to the system calls it needs once the VM is set up; a forbidden call ends it with one line naming the call, status 159 (--seccomp=off to debug; docs/security.md)")
}

// Confine installs policy's seccomp filter on the whole process unless
// --seccomp=off says not to. It is called once the machine (or back-end)
// is set up and before it runs guest-driven code. A kernel without seccomp
// filters is an error that names the way out.
func Confine(c FlagValues, policy seccomp.Policy, log logrus.FieldLogger) error {
	if o, ok := c.Generic("seccomp").(*onOff); ok && !o.on {
		log.Info("seccomp: filter off (--seccomp=off)")
		return nil
	}
	if !OwnsProcess {
		log.Debug("seccomp: filter not installed: Main runs inside another program")
		return nil
	}
	if err := seccomp.Install(policy, seccomp.Options{Prefix: "microvm", Hint: SeccompHint}); err != nil {
		if errors.Is(err, seccomp.ErrUnsupported) {
			return fmt.Errorf("%w (run with --seccomp=off to go without it)", err)
		}
		return err
	}
	log.WithField("policy", policy.Name()).Debug("seccomp: filter installed")
	if AfterConfine != nil {
		AfterConfine()
	}
	return nil
}

// PrivilegeFlags are run's --chroot, --uid and --gid: the root directory
// and the identity microvm takes once the machine is set up.
func PrivilegeFlags() []Opt {
	return []Opt{
		ChrootFlag(),
		Int64Opt("uid", "once the VM is set up, run as this user (with --gid; needs the privilege to change user)"),
		Int64Opt("gid", "once the VM is set up, run as this group, with no supplementary groups (with --uid)"),
	}
}

// Identity is a checked --uid/--gid pair; set is false when neither was
// given.
type Identity struct {
	set      bool
	uid, gid int
}

func ReadPrivilegeFlags(c FlagValues) (Identity, error) {
	if !IsSet(c, "uid") && !IsSet(c, "gid") {
		return Identity{}, nil
	}
	if !IsSet(c, "uid") || !IsSet(c, "gid") {
		return Identity{}, Usagef("--uid and --gid go together")
	}
	uid, gid := c.Int64("uid"), c.Int64("gid")
	// (uid_t)-1 means "unchanged" to setresuid; refuse it with the rest.
	if uid < 0 || uid >= 1<<32-1 || gid < 0 || gid >= 1<<32-1 {
		return Identity{}, Usagef("--uid %d --gid %d: want ids from 0 to 4294967294", uid, gid)
	}
	return Identity{set: true, uid: int(uid), gid: int(gid)}, nil
}

// DropPrivileges makes every thread of the process id's user and group,
// with no supplementary groups (Go applies setuid and friends to all
// threads), after the machine is set up: /dev/kvm, the images, TAPs and
// the vsock sockets are open by then and stay so. Like the filter, only
// when Main owns the process.
func DropPrivileges(id Identity, log logrus.FieldLogger) error {
	if !id.set {
		return nil
	}
	if !OwnsProcess {
		log.Debug("--uid/--gid not applied: Main runs inside another program")
		return nil
	}
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("--uid/--gid: setgroups: %w", err)
	}
	if err := syscall.Setgid(id.gid); err != nil {
		return fmt.Errorf("--gid %d: %w", id.gid, err)
	}
	if err := syscall.Setuid(id.uid); err != nil {
		return fmt.Errorf("--uid %d: %w", id.uid, err)
	}
	log.WithField("uid", id.uid).WithField("gid", id.gid).Debug("privileges dropped")
	return nil
}

// ChrootFlag is --chroot, for the commands that run a device: run, exec,
// vhost-user-vsock.
func ChrootFlag() Opt {
	return StringOpt("chroot", "", "once set up, make DIR the root directory (needs CAP_SYS_CHROOT); paths on the command line are host paths, and the sockets used at run time (vsock, metrics) must lie inside DIR (docs/security.md)")
}

// ReadChroot checks --chroot and returns its directory's canonical host
// path, or "" when it was not given.
func ReadChroot(c FlagValues) (string, error) {
	if !IsSet(c, "chroot") {
		return "", nil
	}
	dir, err := jail.Dir(c.String("chroot"))
	if err != nil {
		return "", UsageError{Err: err}
	}
	return dir, nil
}

// ChrootPath checks that *p, a path microvm still uses once in the jail
// (a socket it dials or removes), lies inside dir and replaces it with its
// canonical host path, which jail.Path maps to its name inside. Nothing to
// do without --chroot (dir "") or without the path (*p "").
func ChrootPath(dir string, p *string, flag string) error {
	if dir == "" || *p == "" {
		return nil
	}
	canon, err := jail.CheckInside(dir, *p, flag)
	if err != nil {
		return UsageError{Err: err}
	}
	*p = canon
	return nil
}

// EnterChroot makes dir the process's root, once the machine is set up
// and before DropPrivileges and the filter (chroot needs CAP_SYS_CHROOT and
// is not on the filter's list). Like them, only when Main owns the process.
// ShareChroot refuses --share with --chroot: the 9P server reopens a
// shared file through /proc/self/fd (devices/virtio9p), which a jail
// directory does not have.
func ShareChroot(root string, cfg microvm.Config) error {
	if root != "" && len(cfg.Shares) > 0 {
		return Usagef("--share cannot be combined with --chroot: the shared directory's server needs /proc/self/fd")
	}
	return nil
}

func EnterChroot(dir string, log logrus.FieldLogger) error {
	if dir == "" {
		return nil
	}
	if !OwnsProcess {
		log.Debug("--chroot not applied: Main runs inside another program")
		return nil
	}
	if err := jail.Enter(dir); err != nil {
		return err
	}
	log.WithField("root", dir).Debug("entered --chroot")
	return nil
}
