package kernel

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// dockerNeeds is what Docker in the guest needs beyond check-config.sh's
// "Generally Necessary" list: bridge networking through iptables-nft and
// iptables-legacy both, overlay2 on ext4, and cgroup v2 with the cpu,
// memory, io and pids controllers and BPF device control (runc's device
// filter under cgroup v2).
var dockerNeeds = []string{
	"NAMESPACES", "NET_NS", "PID_NS", "IPC_NS", "UTS_NS", "USER_NS",
	"CGROUPS", "CGROUP_SCHED", "FAIR_GROUP_SCHED", "MEMCG", "BLK_CGROUP", "CGROUP_PIDS", "CPUSETS",
	"CGROUP_BPF", "BPF_SYSCALL",
	"VETH", "BRIDGE", "BRIDGE_NETFILTER",
	"NETFILTER", "NF_CONNTRACK", "NF_NAT", "NETFILTER_XTABLES",
	"NETFILTER_XT_MATCH_ADDRTYPE", "NETFILTER_XT_MATCH_CONNTRACK", "NETFILTER_XT_TARGET_MASQUERADE",
	"IP_NF_IPTABLES", "IP_NF_FILTER", "IP_NF_NAT", "IP_NF_TARGET_MASQUERADE",
	"NF_TABLES", "NF_TABLES_IPV4", "NFT_COMPAT", "NFT_NAT", "NFT_MASQ", "NFT_CT",
	"POSIX_MQUEUE", "OVERLAY_FS", "EXT4_FS", "EXT4_FS_POSIX_ACL", "SECCOMP_FILTER", "KEYS", "PROC_SYSCTL",
}

// builtConfig reads build/kernel/config, the resolved .config of the
// kernel build.sh last built.
func builtConfig(t *testing.T) (path string, set map[string]string) {
	t.Helper()
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(root, "build/kernel/config")
	b, err := os.ReadFile(path)
	if err != nil {
		testenv.Missing(t, "no guest kernel config (make kernel): %v", err)
	}
	return path, parseConfig(b)
}

// parseConfig maps each CONFIG_NAME a .config sets to its value (y, m, a
// number or a string); options "not set" are absent.
func parseConfig(b []byte) map[string]string {
	set := make(map[string]string)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), "=")
		if name, found := strings.CutPrefix(name, "CONFIG_"); ok && found {
			set[name] = value
		}
	}
	return set
}

// TestDockerBuiltIn: every option Docker needs is built in (the guest
// loads no modules).
func TestDockerBuiltIn(t *testing.T) {
	_, set := builtConfig(t)
	for _, name := range dockerNeeds {
		if v := set[name]; v != "y" {
			t.Errorf("CONFIG_%s=%q, want y: Docker in the guest needs it built in (guest/kernel/microvm.config)", name, v)
		}
	}
}

var ansi = regexp.MustCompile(`\x1b\[[0-9;]*m`)

// necessaryMissing returns the CONFIG_ lines check-config.sh's output
// reports missing in its "Generally Necessary" section. Lines about the
// host it runs on (cgroup hierarchy, apparmor) are not the kernel's.
func necessaryMissing(out []byte) (missing []string, sawSection bool) {
	in := false
	for _, line := range strings.Split(ansi.ReplaceAllString(string(out), ""), "\n") {
		switch {
		case strings.HasPrefix(line, "Generally Necessary:"):
			in, sawSection = true, true
		case strings.HasPrefix(line, "Optional Features:"):
			in = false
		case in && strings.Contains(line, "CONFIG_") && !strings.Contains(line, ": enabled"):
			missing = append(missing, strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "-")))
		}
	}
	return missing, sawSection
}

func TestNecessaryMissing(t *testing.T) {
	out := []byte("info: reading kernel config from x ...\n\nGenerally Necessary:\n" +
		"- cgroup hierarchy: nonexistent??\n" +
		"- \x1b[1mCONFIG_NAMESPACES\x1b[0m: \x1b[32menabled\x1b[0m\n" +
		"- \x1b[1mCONFIG_VETH\x1b[0m: \x1b[1;31mmissing\x1b[0m\n" +
		"- CONFIG_BRIDGE: enabled (as module)\n\nOptional Features:\n- CONFIG_USER_NS: missing\n")
	missing, saw := necessaryMissing(out)
	if !saw || len(missing) != 1 || missing[0] != "CONFIG_VETH: missing" {
		t.Errorf("necessaryMissing = %q, %v; want [CONFIG_VETH: missing], true", missing, saw)
	}
}

// TestDockerCheckConfig runs Docker's own check (check-config.sh from
// Debian's docker.io, fetched by scripts/docker-check-config) against the
// guest kernel's config: nothing it calls generally necessary may be
// missing.
func TestDockerCheckConfig(t *testing.T) {
	config, _ := builtConfig(t)
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(root, "build/docker/check-config.sh")
	if _, err := os.Stat(script); err != nil {
		testenv.Missing(t, "no Docker check-config.sh (make docker-check-config): %v", err)
	}
	// Its exit status also counts optional features and the host's own
	// cgroup mount, so the verdict is read from its report.
	out, _ := exec.Command("bash", script, config).CombinedOutput()
	missing, saw := necessaryMissing(out)
	if !saw {
		t.Fatalf("check-config.sh printed no \"Generally Necessary\" section:\n%s", out)
	}
	if len(missing) > 0 {
		t.Errorf("the guest kernel lacks what Docker calls generally necessary (guest/kernel/microvm.config):\n  %s", strings.Join(missing, "\n  "))
	}
}
