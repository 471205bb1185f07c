package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// pauseImage is the pod sandbox's image in the CRI tests: busybox that
// sleeps (what registry.k8s.io/pause does, without a registry).
const pauseImage = "microvm.test/pause:1"

// The pod network of the CRI test: CNI's bridge plugin on a bridge of the
// test's own, with host-local addresses from a subnet no host here uses.
const (
	cniBridge  = "mvcnitest0"
	cniSubnet  = "10.88.77.0/24"
	cniGateway = "10.88.77.1"
)

// cniPluginDirs are where distributions put CNI's plugins: Debian's
// containernetworking-plugins, then the upstream tarball's place.
var cniPluginDirs = []string{"/usr/lib/cni", "/opt/cni/bin"}

// writeCNIConfig writes the pod network's configuration into the test's
// CNI directory and returns the plugins' directory: a bridge that is the
// pods' gateway (no masquerade: nothing leaves this machine), addresses
// kept in the test's directory. CRI adds loopback itself.
func (e *ctrEnv) writeCNIConfig() string {
	e.t.Helper()
	bin := ""
	for _, d := range cniPluginDirs {
		if _, err := os.Stat(filepath.Join(d, "bridge")); err == nil {
			bin = d
			break
		}
	}
	if bin == "" {
		testenv.Missing(e.t, "CNI plugins: no bridge plugin in %v (apt-get install containernetworking-plugins)", cniPluginDirs)
	}
	conf := filepath.Join(e.dir, "cni", "conf")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		e.t.Fatal(err)
	}
	b, err := json.Marshal(map[string]any{
		"cniVersion": "1.0.0", "name": "microvm-test",
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": cniBridge, "isGateway": true, "ipMasq": false,
			"ipam": map[string]any{"type": "host-local", "dataDir": filepath.Join(e.dir, "cni", "ipam"),
				"ranges": [][]map[string]string{{{"subnet": cniSubnet, "gateway": cniGateway}}},
				"routes": []map[string]string{{"dst": "0.0.0.0/0"}}},
		}},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(conf, "10-microvm-test.conflist"), b, 0o644); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		if _, err := net.InterfaceByName(cniBridge); err == nil {
			exec.Command("ip", "link", "del", cniBridge).Run()
		}
	})
	return bin
}

// criConfig turns the CRI plugin on, as a node would configure it for
// microvm: the runtime handler "microvm" beside the default runc, the
// sandbox image imported by the test, the native snapshotter (any file
// system, the box's too), no AppArmor, the streaming server on loopback,
// and CNI with the test's bridge network.
func criConfig(e *ctrEnv) (string, string) {
	cniBin := e.writeCNIConfig()
	return "disabled_plugins = [" + unusedSnapshotters + "]\n", fmt.Sprintf(`[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  disable_apparmor = true
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.microvm]
      runtime_type = %q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
`, pauseImage, runtimeName, cniBin, filepath.Join(e.dir, "cni", "conf"))
}

// crictl runs crictl against the test's containerd.
func (e *ctrEnv) crictl(bin string, args ...string) (string, string, int) {
	ep := "unix://" + e.sock
	conf := filepath.Join(e.dir, "crictl.yaml")
	if _, err := os.Stat(conf); err != nil {
		os.WriteFile(conf, []byte("runtime-endpoint: "+ep+"\nimage-endpoint: "+ep+"\n"), 0o644)
	}
	return e.tool([]string{"CRI_CONFIG_FILE=" + conf}, bin,
		append([]string{"--runtime-endpoint", ep, "--image-endpoint", ep, "--timeout", "4m"}, args...)...)
}

func (e *ctrEnv) mustCrictl(bin string, args ...string) string {
	e.t.Helper()
	out, errOut, code := e.crictl(bin, args...)
	if code != 0 {
		e.t.Fatalf("crictl %s: status %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return strings.TrimSpace(out)
}

// writeJSON writes v as JSON into the test's directory.
func (e *ctrEnv) writeJSON(name string, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		e.t.Fatal(err)
	}
	p := filepath.Join(e.dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// TestCrictlPod: kubelet's path, through containerd's CRI plugin with the
// runtime handler "microvm", driven by crictl. A pod (its sandbox and two
// containers in one VM) on a CNI bridge network: the guest has the pod's
// address, the node reaches the server at it and the client reaches the
// node's gateway; the client has a read-only root, containerd's
// RuntimeDefault seccomp profile, kubelet's read-only /proc/sys, a
// read-only volume of its own and, with the server, a tmpfs volume (a host
// tmpfs, as kubelet makes for a memory emptyDir): what the client writes
// there the server reads and the host has at once; it talks to the server
// over localhost; crictl logs shows each one's output and
// crictl exec reaches them; they share the sandbox's IPC and UTS
// namespaces, not its PID one; crictl stats reads the client's cgroup in the
// guest, its memory and CPU limits are there and crictl update changes
// them; stop,
// rm, stopp and rmp leave nothing behind.
func TestCrictlPod(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	crictl := testenv.Crictl(t)
	e := startContainerdWith(t, criConfig)
	e.ns = "k8s.io"
	e.importBusybox()
	e.importImage(pauseImage, []string{"sleep", "1000000"})
	// CRI reads its image list at start: restart it to see the imports.
	e.stop()
	e.start()

	scratch := t.TempDir()
	if err := unix.Mount("tmpfs", scratch, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("tmpfs for the volume: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(scratch, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(scratch, "seed"), []byte("seeded\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	private := t.TempDir()
	if err := os.WriteFile(filepath.Join(private, "config"), []byte("configured\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	logs := filepath.Join(e.dir, "pod-logs")
	pod := e.writeJSON("pod.json", map[string]any{
		"metadata":      map[string]any{"name": "pod1", "namespace": "default", "uid": "pod1-uid", "attempt": 1},
		"log_directory": logs,
	})
	server := e.writeJSON("server.json", map[string]any{
		"metadata": map[string]any{"name": "server"},
		"image":    map[string]any{"image": testImage},
		"command":  []string{"sh", "-c", "echo server up; while true; do echo pong | nc -l -p 8080; done"},
		"log_path": "server.log",
		"mounts":   []map[string]any{{"container_path": "/scratch", "host_path": scratch}},
		// Each container its own PID namespace, as kubelet asks without
		// shareProcessNamespace (crictl's default is the pod's).
		"linux": map[string]any{"security_context": map[string]any{"namespace_options": map[string]any{"pid": 1 /* CONTAINER */}}},
	})
	client := e.writeJSON("client.json", map[string]any{
		"metadata": map[string]any{"name": "client"},
		"image":    map[string]any{"image": testImage},
		"command": []string{"sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do nc 127.0.0.1 8080 && break; sleep 1; done; " +
			"touch /x 2>/dev/null && echo root=rw || echo root=ro; cat /scratch/seed; " +
			"echo t > /scratch/f && echo scratch=$(cat /scratch/f); echo pid=$$; grep ^Seccomp: /proc/self/status; " +
			"cat /private/config; touch /private/y 2>/dev/null && echo private=rw || echo private=ro; " +
			"grep -q ' /proc/sys ro,' /proc/self/mountinfo && echo procsys=ro; echo client done; sleep 1000000"},
		"log_path": "client.log",
		"mounts": []map[string]any{{"container_path": "/scratch", "host_path": scratch},
			{"container_path": "/private", "host_path": private, "readonly": true}},
		"linux": map[string]any{"security_context": map[string]any{"readonly_rootfs": true,
			"namespace_options": map[string]any{"pid": 1 /* CONTAINER */},
			"seccomp":           map[string]any{"profile_type": 0 /* RuntimeDefault */},
			// What kubelet sends for procMount Default (crictl sends none).
			"masked_paths": []string{"/proc/kcore", "/proc/keys", "/proc/timer_list"}, "readonly_paths": []string{"/proc/sys", "/proc/sysrq-trigger"}},
			"resources": map[string]any{"memory_limit_in_bytes": 128 << 20,
				"cpu_quota": 50000, "cpu_period": 100000, "cpu_shares": 512}},
	})

	podID := e.mustCrictl(crictl, "runp", "--runtime", "microvm", pod)
	serverID := e.mustCrictl(crictl, "create", podID, server, pod)
	e.mustCrictl(crictl, "start", serverID)
	clientID := e.mustCrictl(crictl, "create", podID, client, pod)
	e.mustCrictl(crictl, "start", clientID)

	var out string
	deadline := time.Now().Add(90 * time.Second)
	for {
		out = e.mustCrictl(crictl, "logs", clientID)
		if strings.Contains(out, "client done") || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("crictl logs client:\n%s", out)
	for _, want := range []string{"pong", "root=ro", "seeded", "scratch=t", "pid=1\n", "Seccomp:\t2", "configured", "private=ro", "procsys=ro", "client done"} {
		if !strings.Contains(out, want) {
			raw, _ := os.ReadFile(filepath.Join(logs, "client.log"))
			t.Fatalf("client's log lacks %q; the log file:\n%s", want, raw)
		}
	}
	if got := e.mustCrictl(crictl, "logs", serverID); !strings.Contains(got, "server up") {
		t.Errorf("crictl logs server: %q", got)
	}
	// The client runs under containerd's RuntimeDefault seccomp profile,
	// its execs too; the server, which asked for none, runs without.
	for id, want := range map[string]string{clientID: "Seccomp:\t2", serverID: "Seccomp:\t0"} {
		if got := e.mustCrictl(crictl, "exec", "-s", id, "grep", "^Seccomp:", "/proc/self/status"); got != want {
			t.Errorf("crictl exec -s %s grep Seccomp: %q, want %q", id, got, want)
		}
	}
	// The pod's containers share the sandbox's IPC and UTS namespaces in
	// the guest (CRI names them in each container's spec), and each has
	// its own PID namespace (the client is PID 1 of its own, above).
	nsIDs := func(id string) string {
		return e.mustCrictl(crictl, "exec", "-s", id, "sh", "-c", "readlink /proc/self/ns/ipc; readlink /proc/self/ns/uts; readlink /proc/self/ns/pid")
	}
	cns, sns := strings.Split(nsIDs(clientID), "\n"), strings.Split(nsIDs(serverID), "\n")
	if len(cns) != 3 || len(sns) != 3 || cns[0] != sns[0] || cns[1] != sns[1] || cns[2] == sns[2] {
		t.Errorf("namespaces (ipc, uts, pid) of the client %q and the server %q: want the same IPC and UTS, different PID", cns, sns)
	}
	if got := e.mustCrictl(crictl, "exec", "-s", clientID, "cat", "/scratch/f"); got != "t" {
		t.Errorf("crictl exec -s client cat /scratch/f: %q, want t", got)
	}
	// The volume the two share is the host's directory itself (the pod's
	// shared directory, virtio-9p): the client's write is on the host and
	// the server reads it; a write on the host shows in the guest.
	if b, err := os.ReadFile(filepath.Join(scratch, "f")); err != nil || string(b) != "t\n" {
		t.Errorf("the host's copy of the client's /scratch/f: %q, %v; want t", b, err)
	}
	if got := e.mustCrictl(crictl, "exec", "-s", serverID, "cat", "/scratch/f"); got != "t" {
		t.Errorf("crictl exec -s server cat /scratch/f: %q, want the client's t", got)
	}
	if err := os.WriteFile(filepath.Join(scratch, "from-host"), []byte("h\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := e.mustCrictl(crictl, "exec", "-s", clientID, "cat", "/scratch/from-host"); got != "h" {
		t.Errorf("crictl exec -s client cat /scratch/from-host: %q, want h", got)
	}
	if got := e.mustCrictl(crictl, "exec", "-s", serverID, "sh", "-c", "ls /private 2>/dev/null || echo none"); got != "none" {
		t.Errorf("the server sees the client's volume: %q", got)
	}
	// Stats come from the container's cgroup in the guest.
	var stats struct {
		Stats []struct {
			CPU struct {
				UsageCoreNanoSeconds struct{ Value string } `json:"usageCoreNanoSeconds"`
			} `json:"cpu"`
			Memory struct {
				WorkingSetBytes struct{ Value string } `json:"workingSetBytes"`
			} `json:"memory"`
		} `json:"stats"`
	}
	sj := e.mustCrictl(crictl, "stats", "-o", "json", clientID)
	if err := json.Unmarshal([]byte(sj), &stats); err != nil || len(stats.Stats) != 1 {
		t.Errorf("crictl stats: %v\n%s", err, sj)
	} else if cs := stats.Stats[0]; cs.CPU.UsageCoreNanoSeconds.Value == "" || cs.CPU.UsageCoreNanoSeconds.Value == "0" ||
		cs.Memory.WorkingSetBytes.Value == "" || cs.Memory.WorkingSetBytes.Value == "0" {
		t.Errorf("crictl stats of the client: want CPU time and a working set from the guest:\n%s", sj)
	}
	// The memory limit reaches the client's cgroup in the guest, and
	// crictl update changes it.
	// On a cgroup v2 node containerd gives each container a cgroup
	// namespace: in the guest its cgroup is then its root, and CRI's
	// /sys/fs/cgroup mount shows that cgroup alone (as under runc).
	cg := "/sys/fs/cgroup/" + clientID
	wantCgroup := "0::/" + clientID
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		cg, wantCgroup = "/sys/fs/cgroup", "0::/"
	}
	if got := e.mustCrictl(crictl, "exec", "-s", clientID, "cat", "/proc/self/cgroup"); got != wantCgroup {
		t.Errorf("/proc/self/cgroup of a process in the client: %q, want %q", got, wantCgroup)
	}
	memMax := "cat " + cg + "/memory.max"
	if got := e.mustCrictl(crictl, "exec", "-s", clientID, "sh", "-c", memMax); got != strconv.Itoa(128<<20) {
		t.Errorf("memory.max of the client: %q, want %d", got, 128<<20)
	}
	e.mustCrictl(crictl, "update", "--memory", strconv.Itoa(96<<20), clientID)
	if got := e.mustCrictl(crictl, "exec", "-s", clientID, "sh", "-c", memMax); got != strconv.Itoa(96<<20) {
		t.Errorf("memory.max of the client after crictl update: %q, want %d", got, 96<<20)
	}
	// So do the CPU quota and shares (as cgroup v2's cpu.weight, mapped
	// as runc maps them: 512 shares are weight 20).
	cpuFiles := "cat " + cg + "/cpu.max " + cg + "/cpu.weight"
	if got := e.mustCrictl(crictl, "exec", "-s", clientID, "sh", "-c", cpuFiles); got != "50000 100000\n20" {
		t.Errorf("cpu.max and cpu.weight of the client: %q, want 50000 100000 and 20", got)
	}
	e.mustCrictl(crictl, "update", "--cpu-quota", "20000", clientID)
	if got := e.mustCrictl(crictl, "exec", "-s", clientID, "sh", "-c", cpuFiles); got != "20000 100000\n20" {
		t.Errorf("cpu.max and cpu.weight of the client after crictl update: %q, want 20000 100000 and 20", got)
	}
	checkPodNetwork(t, e, crictl, podID, serverID, clientID)
	if p := e.shimPids(); len(p) != 1 {
		t.Errorf("shim processes for one pod: %v, want 1", p)
	}
	if ps := e.mustCrictl(crictl, "ps", "-q", "--pod", podID); len(strings.Fields(ps)) != 2 {
		t.Errorf("crictl ps: %q, want the two containers", ps)
	}

	e.mustCrictl(crictl, "stop", "--timeout", "2", clientID)
	e.mustCrictl(crictl, "rm", clientID)
	e.mustCrictl(crictl, "stop", "--timeout", "2", serverID)
	e.mustCrictl(crictl, "rm", serverID)
	e.mustCrictl(crictl, "stopp", podID)
	e.mustCrictl(crictl, "rmp", podID)
	if l := e.mustCrictl(crictl, "pods", "-q"); l != "" {
		t.Errorf("pods left: %q", l)
	}
	e.leftovers()
}

// checkPodNetwork: the pod's address from CNI is the guest's eth0, the
// node (this process, beside the bridge) reaches the server at it, and
// the client reaches a listener on the node's side of the bridge.
func checkPodNetwork(t *testing.T, e *ctrEnv, crictl, podID, serverID, clientID string) {
	t.Helper()
	var insp struct {
		Status struct {
			Network struct{ IP string } `json:"network"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(e.mustCrictl(crictl, "inspectp", "-o", "json", podID)), &insp); err != nil {
		t.Fatalf("crictl inspectp: %v", err)
	}
	podIP := insp.Status.Network.IP
	_, subnet, _ := net.ParseCIDR(cniSubnet)
	if ip := net.ParseIP(podIP); ip == nil || !subnet.Contains(ip) {
		t.Fatalf("the pod's address %q is not in CNI's %s", podIP, cniSubnet)
	}
	if got := e.mustCrictl(crictl, "exec", "-s", serverID, "busybox", "ip", "-4", "-o", "addr", "show", "dev", "eth0"); !strings.Contains(got, " "+podIP+"/24 ") {
		t.Errorf("the guest's eth0: %q, want the pod's address %s", got, podIP)
	}

	// Node to pod: the server answers pong at the pod's address.
	var got []byte
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(podIP, "8080"), 5*time.Second)
		if err == nil {
			c.SetDeadline(time.Now().Add(10 * time.Second))
			got, _ = io.ReadAll(c)
			c.Close()
			if strings.TrimSpace(string(got)) == "pong" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node could not reach the server at %s:8080: %v (read %q)", podIP, err, got)
		}
		time.Sleep(500 * time.Millisecond)
	}

	// Pod to node: the client sends a line to the gateway's side.
	l, err := net.Listen("tcp", net.JoinHostPort(cniGateway, "0"))
	if err != nil {
		t.Fatalf("listen on the bridge: %v", err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	line := make(chan string, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			line <- err.Error()
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		b, _ := io.ReadAll(c)
		line <- strings.TrimSpace(string(b))
	}()
	e.mustCrictl(crictl, "exec", "-s", clientID, "sh", "-c", fmt.Sprintf("echo hello node | nc -w 5 %s %d", cniGateway, port))
	select {
	case got := <-line:
		if got != "hello node" {
			t.Errorf("the node read %q from the pod, want %q", got, "hello node")
		}
	case <-time.After(60 * time.Second):
		t.Errorf("the pod's line never reached the node at %s:%d", cniGateway, port)
	}
}
