# microvm: build, demo, test and benchmark.
#
#   make              bin/microvm and bin/microvm-full (static), bin/microvm-agent,
#                     bin/microvm-net, bin/containerd-shim-microvm-v2 (the containerd
#                     runtime), bin/testguest and the guest kernel (make kernel)
#   make run          the demo: the test guest, then Linux with the guest agent
#                     (commands and a gRPC call over vsock)
#   make test-net     TestNetLinux alone (make test runs it too; docs/net.md)
#   make check        the inner loop, about 2 minutes warm: vet, gofmt, staticcheck,
#                     go test -short ./... (in-process; the test guest where this
#                     host's KVM runs it); no kernels, no box, no fuzzing
#   make test         everything CI runs: vet, gofmt, staticcheck, go test -race,
#                     every fuzz target for 2 s (fuzz-smoke),
#                     the test guest's host and QEMU tests, the Linux test kernel
#   make kernel       build/kernel/{vmlinux,bzImage} (cached; minutes the first time)
#   make debian-image build/images/debian-12.tar: Debian 12 (minbase) from Debian's
#                     archive with mmdebstrap, for microvm image import --rootfs
#                     (make debian-docker-image: build/images/debian-12-docker.tar,
#                     the CI image with Docker, docs/ci.md)
#   make initramfs    build/linux/initramfs.cpio.gz: the Linux test guest's Go /init
#   make kvmbox       the nested-KVM box's L1 kernel and init (build/kvmbox; 7 min once)
#   make debian-kernel build/debian: Debian's cloud kernel (apt-get download, once) and
#                     an initramfs with the Go /init and its virtio/vsock modules
#   make conformance  the vhost-user conformance suite: Linux under QEMU (docs/vhost-user.md)
#   make fuzz         every fuzz target for FUZZTIME each (default 30s; FUZZ=regexp
#                     picks targets); make fuzz-smoke: the same, FUZZ_SMOKE_TIME each
#                     (default 2s), for CI (docs/reliability.md)
#   make bench        every benchmark (make bench-boot: boot time against QEMU;
#                     make bench-linux-boot: Linux to /init, microvm and QEMU;
#                     make bench-exec: agent boot, exec latency, stdout MB/s;
#                     make bench-device: the vsock device through vhost-user, no KVM;
#                     make bench-blk, bench-net: virtio-blk MB/s and IOPS, TCP
#                     Mbit/s over a TAP, microvm and QEMU; make bench-usernet:
#                     the --net user network's TCP MB/s and set-up, no VM;
#                     make bench-images: image pull and conversion, VM start for a
#                     16 MiB and a 1 GiB image, exec --vm against exec --image;
#                     make bench-ci: a CI job through microvm ci gitlab, stage by
#                     stage, against the same scripts on this host;
#                     make bench-docker: exec --docker's VM start to docker info,
#                     docker build cold and from a cache, docker run, and a 1 GiB
#                     cache disk's clone and commit;
#                     make bench-containerd: containers through containerd,
#                     microvm's shim against runc; make bench-snapshot: restore
#                     against cold boot to the agent answering, restore time by
#                     guest memory, snapshot size and time, 10 restored clones' RSS)
#   make soak         the scale and soak runs (docs/soak.md): make soak-conns
#                     (10,000 vsock connections open at once), soak-bytes (10 GiB
#                     each way, SHA-256 checked), soak-cycles (1000 VM start/stop
#                     cycles through the Go API); minutes each, not in make test
#   make clean        remove bin/ and the test guest's objects (keeps the kernel cache)
#   make distclean    also remove build/ (kernel cache, tools)
#   make clean-cache  empty the artefact cache shared by clones on this machine
#                     (~/.cache/microvm: kernels and Debian images keyed by the
#                     hash of their inputs; docs/testing.md, "The artefact cache")
#
# Everything generated lives in bin/ or build/ (both git-ignored).

GO          ?= go
VERSION     := $(shell git describe --always --dirty 2>/dev/null || echo dev)
GOFLAGS_BIN := -trimpath -ldflags "-s -w -X main.Version=$(VERSION)"
TOOLS       := $(CURDIR)/build/tools
# staticcheck 2026.2.x (v0.8.x) is the first release line that knows Go 1.26.
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(TOOLS)/staticcheck
# crictl (kubelet's CRI as a command) for the shim's CRI tests; v1.37.0 is
# the newest cri-tools the module proxy serves for Go 1.26.
CRICTL_VERSION := v1.37.0
CRICTL      := $(TOOLS)/crictl
GO_TEST_FLAGS ?= -race -timeout 20m
# Every go command here builds with -trimpath, so that what it compiles does
# not depend on the clone's directory: a second clone on this machine finds
# its race builds, vet's and staticcheck's results in the caches (a fresh
# clone of the same commit, 2026-12-07: building every race test binary
# 118 -> 69 s, go vet 23 -> 1 s, staticcheck 37 -> 1 s; docs/testing.md).
export GOFLAGS := $(strip $(GOFLAGS) -trimpath)
# Under CI=true every test runs, whatever Go's test cache holds: with
# -trimpath another clone's results would match.
ifeq ($(CI),true)
GO_TEST_FLAGS += -count=1
endif
BENCH_RUNS  ?= 20

.PHONY: check clean-cache all run test test-steps deps-run deps-test vet fmt-check staticcheck go-test go-test-box go-test-rest guest-test kernel docker-check-config conformance fuzz fuzz-smoke \
	bench bench-boot bench-usernet bench-images bench-ci bench-docker bench-containerd bench-snapshot bench-vsock bench-device clean distclean bin/microvm bin/microvm-full bin/microvm-net bin/microvm-agent bin/containerd-shim-microvm-v2 bin/testguest initramfs kvmbox debian-kernel \
	build/nettest debian-image debian-build-image debian-docker-image test-net test-start box-test test-summary bench-linux-boot bench-exec bench-blk bench-net examples \
	soak soak-conns soak-bytes soak-cycles build/bench/soak

# The binaries and the guest kernel that exec, run --with-agent and
# --image boot by default (built once, minutes; nothing after that).
all: bin/microvm bin/microvm-full bin/microvm-net bin/microvm-agent bin/containerd-shim-microvm-v2 bin/testguest kernel

# go build is incremental, so the target is always handed to it.
# bin/microvm is the lean CLI (cmd/microvm): `run` and `version`, handing
# every other command to bin/microvm-full (cmd/microvm-full), every
# command, beside it (cmd/microvm/lean.go, handOff; docs/benchmarks.md,
# "Start-up"). urfave_cli_no_docs is urfave/cli's own tag: no man page or
# markdown writers.
bin/microvm:
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BIN) -o $@ ./cmd/microvm

bin/microvm-full:
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BIN) -tags urfave_cli_no_docs -o $@ ./cmd/microvm-full

# The guest agent (docs/agent.md): static, the /init of `microvm exec`'s guest.
bin/microvm-agent:
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BIN) -o $@ ./guest/agent/cmd/microvm-agent

# The containerd runtime io.containerd.microvm.v2 (docs/containerd.md):
# containerd finds it by this name in its PATH.
bin/containerd-shim-microvm-v2:
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BIN) -o $@ ./cmd/containerd-shim-microvm-v2

# The process of a --net user network (gVisor's netstack): microvm starts it
# from beside its own binary, so neither VMM binary links the netstack.
bin/microvm-net:
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BIN) -o $@ ./cmd/microvm-net

# The Go API examples (examples/): built static, so greeterd can go into a
# guest image as it is.
examples:
	@mkdir -p build/examples
	CGO_ENABLED=0 $(GO) build -o build/examples/ ./examples/cijob ./examples/rpcservice/host ./examples/rpcservice/greeterd

# The static guest-side network test helper (guest/nettest): TestNetLinux
# puts it in its guest image. Built here so nothing is built in the box.
build/nettest:
	@mkdir -p build
	CGO_ENABLED=0 $(GO) build -o $@ ./guest/nettest

# A Debian 12 (minbase) root file system from Debian's archive, for the
# image tests (microvm image import --rootfs); rebuilt only when
# scripts/debian-image changes.
debian-image:
	scripts/debian-image build/images/debian-12.tar

# The same with what a CI job needs (the GitLab executor's test image).
debian-build-image:
	scripts/debian-image build/images/debian-12-build.tar bash,git,gcc,libc6-dev,make,curl,ca-certificates

# The CI image with Docker (docs/ci.md): the build image's packages plus
# Debian's docker.io (which pulls containerd and runc), iptables for its
# bridge network, e2fsprogs and procps; make test builds it for TestExecDocker.
debian-docker-image:
	scripts/debian-image build/images/debian-12-docker.tar bash,git,gcc,libc6-dev,make,curl,ca-certificates,docker.io,containerd,iptables,e2fsprogs,procps

bin/testguest:
	$(MAKE) -C guest/testguest OUT=$(CURDIR)/bin/testguest

# The demo (scripts/demo.sh): the test guest on two vCPUs, then Linux with
# the guest agent: uname -a and a script run in it through the Go API, and a
# gRPC service in the guest called over vsock. Steps this host's KVM cannot
# run go to the nested-KVM box.
run: deps-run
	$(MAKE) all examples kernel
	scripts/demo.sh

# The Debian packages each path needs, only the missing ones (scripts/deps).
deps-run deps-test: deps-%:
	scripts/deps $*

# --- tests -------------------------------------------------------------------

# Where tests record which layer ran where, and which tests wait for the box
# (internal/testing/testenv: RequireKVM, Record); reset by every make test.
RECORD      := $(CURDIR)/build/test-record
# Prebuilt artefacts for the tests, so nothing is built inside the box.
TEST_ENV    := MICROVM_TEST_RECORD=$(RECORD) MICROVM_TESTGUEST=$(CURDIR)/bin/testguest \
	MICROVM_BINARY=$(CURDIR)/bin/microvm MICROVM_INITRD=$(CURDIR)/build/linux/initramfs.cpio.gz \
	MICROVM_AGENT=$(CURDIR)/bin/microvm-agent MICROVM_EXAMPLES=$(CURDIR)/build/examples \
	MICROVM_NETTEST=$(CURDIR)/build/nettest MICROVM_NET=$(CURDIR)/bin/microvm-net \
	MICROVM_SHIM=$(CURDIR)/bin/containerd-shim-microvm-v2 MICROVM_CRICTL=$(CRICTL) \
	MICROVM_DEBIAN_IMAGE=$(CURDIR)/build/images/debian-12.tar \
	MICROVM_DEBIAN_BUILD_IMAGE=$(CURDIR)/build/images/debian-12-build.tar \
	MICROVM_DEBIAN_DOCKER_IMAGE=$(CURDIR)/build/images/debian-12-docker.tar

# The inner loop (docs/testing.md, "make check"): what can fail fast, in
# minutes; go test's cache keeps unchanged packages' results. What needs a
# kernel, QEMU or the box is make test's.
# The binaries without the kernel: tests run bin/microvm and its full half.
check: bin/microvm bin/microvm-full bin/microvm-net bin/microvm-agent bin/containerd-shim-microvm-v2 bin/testguest vet fmt-check staticcheck
	MICROVM_TESTGUEST=$(CURDIR)/bin/testguest MICROVM_CONFORMANCE=off $(GO) test -short ./...

# make test's stages, in order; scripts/test-stages runs each and times it,
# scripts/test-times prints the table (and build/test-record/times.json).
# go-test-box runs the packages whose tests may queue for the box, before
# it; box-test+go-test-rest+...: the other packages' tests, the fuzz smoke,
# vet and staticcheck run at idle priority, one after another, beside the box stage,
# which leaves most of a core idle (docs/testing.md). all+debian-image+...:
# the three Debian images (downloads and dpkg, about one busy core) are
# built at idle priority beside the binaries and the test kernel, where a
# first run on a machine spends its first ten minutes; a second clone finds
# all of them cached.
TEST_STAGES := deps-test all+debian-image+debian-build-image+debian-docker-image examples build/nettest kernel docker-check-config initramfs kvmbox conformance \
	fmt-check go-test-box guest-test box-test+go-test-rest+fuzz-smoke+vet+staticcheck

test:
	@$(MAKE) --no-print-directory test-start
	@MAKE='$(MAKE)' scripts/test-stages $(RECORD) $(TEST_STAGES)
	@scripts/test-times $(RECORD)
	@$(MAKE) --no-print-directory test-summary

# The same stages untimed, in one make (make -k test-steps goes on past a failure).
test-steps: test-start $(subst +, ,$(TEST_STAGES)) test-summary

test-start:
	@rm -rf $(RECORD) && mkdir -p $(RECORD)
	@echo "test: this host's KVM: $$(scripts/host-kvm) (tests it cannot run go to the nested-KVM box)"

vet:
	$(GO) vet ./...

# Go files tracked or new (not ignored): build/ holds the kernel tree.
fmt-check:
	@files=$$(git ls-files -co --exclude-standard '*.go' | while read -r f; do [ -f "$$f" ] && echo "$$f"; done); \
	bad=$$(gofmt -l $$files); \
	if [ -n "$$bad" ]; then echo "gofmt needed on:"; echo "$$bad"; exit 1; fi; \
	echo "gofmt: $$(echo $$files | wc -w) files ok"

$(STATICCHECK):
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

$(CRICTL):
	GOBIN=$(TOOLS) $(GO) install sigs.k8s.io/cri-tools/cmd/crictl@$(CRICTL_VERSION)

staticcheck: $(STATICCHECK)
	$(STATICCHECK) ./...

# MICROVM_TESTGUEST and the kernel in build/kernel are what the KVM
# integration tests boot; under CI=true they fail rather than skip when
# /dev/kvm or either artefact is missing.
go-test: bin/testguest $(CRICTL)
	$(TEST_ENV) MICROVM_CONFORMANCE=off $(GO) test $(GO_TEST_FLAGS) ./...

# go-test in two halves for make test (scripts/test-packages): the packages
# whose tests may queue for the box, then, beside the box, the rest, where
# a test that would still queue itself fails (MICROVM_BOX_QUEUE_CLOSED).
go-test-box: bin/testguest $(CRICTL)
	pkgs=$$(GO=$(GO) scripts/test-packages box) && [ -n "$$pkgs" ] && \
	$(TEST_ENV) MICROVM_CONFORMANCE=off $(GO) test $(GO_TEST_FLAGS) $$pkgs

go-test-rest: bin/testguest $(CRICTL)
	pkgs=$$(GO=$(GO) scripts/test-packages rest) && [ -n "$$pkgs" ] && \
	$(TEST_ENV) MICROVM_BOX_QUEUE_CLOSED=1 MICROVM_CONFORMANCE=off $(GO) test $(GO_TEST_FLAGS) $$pkgs

# The tests go-test and conformance queued because this host's KVM cannot
# run them (Linux, guest interrupts; everything without /dev/kvm), run in the
# nested-KVM box (scripts/box-test, docs/testing.md).
box-test: all initramfs build/nettest $(CRICTL)
	$(TEST_ENV) scripts/box-test $(RECORD)

# TestNetLinux alone (docs/net.md): Linux's virtio-net driver over a TAP in
# a private network namespace; in the nested-KVM box where this host's KVM
# cannot run Linux. make test runs it as well, in a box of its own.
NET_RECORD := $(CURDIR)/build/test-record-net
test-net: all build/nettest kernel
	@rm -rf $(NET_RECORD) && mkdir -p $(NET_RECORD)
	$(TEST_ENV) MICROVM_TEST_RECORD=$(NET_RECORD) $(GO) test -count=1 -timeout 20m -run '^TestNetLinux$$' -v .
	$(TEST_ENV) MICROVM_TEST_RECORD=$(NET_RECORD) scripts/box-test $(NET_RECORD)

# One line: which layer ran where. Under CI=true a layer that ran nowhere fails.
test-summary:
	@scripts/test-summary $(RECORD)

guest-test: bin/testguest bin/microvm bin/microvm-full
	$(MAKE) -C guest/testguest test qemu-test irq-test OUT=$(CURDIR)/bin/testguest MICROVM=$(CURDIR)/bin/microvm

kernel:
	guest/kernel/build.sh build/kernel

# Docker's own kernel check (contrib/check-config.sh of Debian's docker.io,
# the script only), which guest/kernel's test runs against the kernel's config.
docker-check-config:
	scripts/docker-check-config build/docker/check-config.sh

# Debian's linux-image-cloud-amd64 and an initramfs for it (TestDebianCloudKernel).
debian-kernel:
	GO=$(GO) scripts/debian-kernel build/debian

# The Linux test guest's initramfs: the static Go /init (guest/init).
initramfs:
	@mkdir -p build/linux
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags=-s -o build/linux/init ./guest/init
	$(GO) run ./guest/mkinitramfs -o build/linux/initramfs.cpio.gz -init build/linux/init

# The nested-KVM box (scripts/kvmbox, docs/testing.md): its L1 kernel, init
# and runner, checked by booting it once.
kvmbox: deps-test
	scripts/kvmbox -- true

# Linux 6.1 under QEMU -M microvm (TCG) against bin/microvm vhost-user-vsock,
# built by the tests; about 10 s (30 s with a cold build cache). go-test leaves
# it to this target (MICROVM_CONFORMANCE=off). Under CI=true a missing kernel
# or QEMU fails it.
conformance: deps-test kernel initramfs bin/microvm bin/microvm-full
	$(TEST_ENV) $(GO) test -count=1 -timeout 10m ./conformance

# --- fuzzing -------------------------------------------------------------------

# Every fuzz target in the module (scripts/fuzz finds each `func FuzzX` in a
# test file, so a new one is never left out), FUZZTIME each, one after the
# other: go test runs one -fuzz target per call. FUZZ keeps the targets
# whose "package/FuzzName" matches (an extended regexp). Crashers land in
# <package>/testdata/fuzz/<Target>/; logs in build/fuzz/. The targets and
# what they check: docs/reliability.md.
FUZZTIME        ?= 30s
FUZZ            ?= .
FUZZ_SMOKE_TIME ?= 2s

fuzz:
	GO=$(GO) scripts/fuzz $(FUZZTIME) '$(FUZZ)'

# Each target for FUZZ_SMOKE_TIME, as CI runs them: its corpus as the
# baseline and a short run, about 5 s a target on the 2-core development
# machine with the build cache warm (docs/reliability.md); depth is make fuzz's.
fuzz-smoke:
	GO=$(GO) scripts/fuzz $(FUZZ_SMOKE_TIME) '$(FUZZ)'

# --- benchmarks ----------------------------------------------------------------

bench: bench-boot bench-vsock bench-linux-boot bench-exec bench-device bench-blk bench-net bench-usernet bench-images bench-ci bench-docker bench-containerd bench-snapshot

# Containers through containerd (docs/containerd.md): start until running,
# exec latency, reading the whole image, stop, and host memory per
# container, microvm's shim with each root file system method (ext4, 9p)
# against runc in the same run, on the busybox image and one
# BENCH_CONTAINERD_BIG_MIB bigger, BENCH_CONTAINERD_N rounds (p50/p99). In the
# nested-KVM box where this host's KVM cannot boot Linux (TCG figures, and
# the table says so); build/bench/containerd.json for machines.
BENCH_CONTAINERD_N ?= 20
BENCH_CONTAINERD_BIG_MIB ?= 64
# In the box the density run stops at this many pods: the box's L1 (QEMU
# TCG emulating SVM) was seen to reset at 36 nested VMs with memory left.
BENCH_CONTAINERD_BOX_PODS ?= 32
BENCH_CONTAINERD_ENV = MICROVM_BENCH_CONTAINERD=$(CURDIR)/build/bench/containerd.json \
	MICROVM_BENCH_N=$(BENCH_CONTAINERD_N) MICROVM_BENCH_BIG_MIB=$(BENCH_CONTAINERD_BIG_MIB) MICROVM_SHIM=$(CURDIR)/bin/containerd-shim-microvm-v2 \
	MICROVM_BZIMAGE=$(CURDIR)/build/kernel/bzImage MICROVM_AGENT=$(CURDIR)/bin/microvm-agent
bench-containerd: deps-test bin/containerd-shim-microvm-v2 bin/microvm-agent kernel
	@mkdir -p build/bench
	$(GO) test -c -o build/bench/containerd.test ./cmd/containerd-shim-microvm-v2
	@if [ "$$(scripts/host-kvm)" = hardware ]; then \
		env $(BENCH_CONTAINERD_ENV) build/bench/containerd.test -test.run '^TestContainerdBench$$' -test.timeout 60m; \
	else \
		echo "bench-containerd: this host's KVM cannot boot Linux; running in the nested-KVM box"; \
		scripts/kvmbox --timeout 60m -- env $(BENCH_CONTAINERD_ENV) MICROVM_BENCH_PODS=$(BENCH_CONTAINERD_BOX_PODS) \
			$(CURDIR)/build/bench/containerd.test \
			-test.run '^TestContainerdBench$$' -test.timeout 55m; \
	fi

# A CI job through `microvm ci gitlab` (docs/ci.md), stage by stage, against
# the same scripts run on this host with bash, and with the warm pool (docs/benchmarks.md, "CI
# jobs"); where Linux cannot boot here, in the nested-KVM box (TCG times).
CI_BENCH_ARGS = -microvm $(CURDIR)/bin/microvm -kernel $(CURDIR)/build/kernel/bzImage -agent $(CURDIR)/bin/microvm-agent \
	-image $(CURDIR)/build/images/debian-12-build.tar -json $(CURDIR)/build/bench/ci.json
bench-ci: all debian-build-image
	CGO_ENABLED=0 $(GO) build -o build/bench/ci-bench ./bench/ci
	@if [ "$$(scripts/host-kvm)" = hardware ]; then \
		build/bench/ci-bench $(CI_BENCH_ARGS); \
	else \
		echo "bench-ci: this host's KVM cannot boot Linux; running in the nested-KVM box"; \
		scripts/kvmbox --timeout 30m -- $(CURDIR)/build/bench/ci-bench $(CI_BENCH_ARGS); \
	fi

# Docker in a microVM (docs/benchmarks.md, "Docker in a microVM"): on this
# host, no VM, a 1 GiB cache disk's clone and commit (internal/cachedisk:
# the method, reflink or sparse copy, and the file system); then, where
# Linux boots (here on hardware KVM, else the nested-KVM box: TCG times that
# show it works, not its speed), two exec --docker runs with Docker's data
# root on one --cache, the first on an empty cache and the second on what
# the first committed: VM start to docker info answering, docker build of a
# small project (cold, then from the cache) and docker run --rm.
# build/bench/docker-cache.json and docker-vm.json; the state (the image,
# imported once on this host) under build/bench/docker-state.
DOCKER_BENCH_STATE := $(CURDIR)/build/bench/docker-state
DOCKER_BENCH_VM_ARGS = vm -state $(DOCKER_BENCH_STATE) -microvm $(CURDIR)/bin/microvm \
	-kernel $(CURDIR)/build/kernel/bzImage -agent $(CURDIR)/bin/microvm-agent \
	-image $(CURDIR)/build/images/debian-12-docker.tar -json $(CURDIR)/build/bench/docker-vm.json
bench-docker: bin/microvm bin/microvm-full bin/microvm-net bin/microvm-agent kernel debian-docker-image
	CGO_ENABLED=0 $(GO) build -o build/bench/docker-bench ./bench/docker
	build/bench/docker-bench cache -dir $(DOCKER_BENCH_STATE) -json $(CURDIR)/build/bench/docker-cache.json
	@echo
	build/bench/docker-bench $(DOCKER_BENCH_VM_ARGS) -import-only
	@if build/bench/docker-bench vm -host-check >/dev/null; then \
		build/bench/docker-bench $(DOCKER_BENCH_VM_ARGS); \
	else \
		echo "bench-docker: this host's KVM cannot boot Linux; the VM part runs in the nested-KVM box"; \
		scripts/kvmbox --timeout 60m -- $(CURDIR)/build/bench/docker-bench $(DOCKER_BENCH_VM_ARGS); \
	fi

# Images (docs/benchmarks.md, "Images"): on this host, pull and convert a
# 16 MiB and a 1 GiB image from a registry in the benchmark's own process
# (loopback); then, where Linux boots (here on hardware KVM, else the
# nested-KVM box: TCG times, read the ratios), VM start to agent ready for
# each, exec --vm against exec --image; and bench-usernet's --net user TCP
# MB/s against the loopback.
IMAGES_STATE := $(CURDIR)/build/bench/images-state
IMAGES_BOOT_ARGS = boot -state $(IMAGES_STATE) -microvm $(CURDIR)/bin/microvm -kernel $(CURDIR)/build/kernel/bzImage \
	-agent $(CURDIR)/bin/microvm-agent -json $(CURDIR)/build/bench/images-boot.json
bench-images: all bench-usernet
	CGO_ENABLED=0 $(GO) build -o build/bench/images-bench ./bench/images
	build/bench/images-bench prepare -state $(IMAGES_STATE) -json $(CURDIR)/build/bench/images-prepare.json
	@if [ "$$(scripts/host-kvm)" = hardware ]; then \
		build/bench/images-bench $(IMAGES_BOOT_ARGS); \
	else \
		echo "bench-images: this host's KVM cannot boot Linux; VM starts in the nested-KVM box"; \
		scripts/kvmbox --timeout 30m -- $(CURDIR)/build/bench/images-bench $(IMAGES_BOOT_ARGS); \
	fi

# Against QEMU and against BASELINE_REV, the last commit before the guest
# agent (the start-up figures compared in docs/benchmarks.md, "Start-up"),
# built into build/baseline once; each VMM's peak RSS read as VmHWM at its
# exit. Without that commit in the history (a shallow clone) the baseline
# row is left out.
BASELINE_REV ?= 41d2896~1
bench-boot: deps-test all
	@if GO=$(GO) scripts/build-baseline $(BASELINE_REV) $(CURDIR)/build/baseline; then \
		baseline=$(CURDIR)/build/baseline/microvm; else baseline=; fi; \
	$(GO) run ./bench/boot -n $(BENCH_RUNS) -microvm bin/microvm -guest bin/testguest -baseline "$$baseline" -json build/bench/boot.json

# Linux to /init under microvm and under QEMU -M microvm with KVM, same
# kernel and initramfs (docs/benchmarks.md). Where this host's KVM cannot
# boot Linux (none, or PVM) it runs in the nested-KVM box, at TCG speed: a
# functional comparison there, not boot times.
LINUXBOOT_RUNS ?= 5
bench-linux-boot: bin/microvm bin/microvm-full kernel initramfs
	CGO_ENABLED=0 $(GO) build -o build/bench/linuxboot ./bench/linuxboot
	@if build/bench/linuxboot -host-check; then \
		build/bench/linuxboot -n $(LINUXBOOT_RUNS) -json build/bench/linuxboot.json; \
	else \
		echo "bench-linux-boot: this host's KVM cannot boot Linux; running in the nested-KVM box"; \
		scripts/kvmbox --timeout 30m -- $(CURDIR)/build/bench/linuxboot -n $(LINUXBOOT_RUNS) \
			-json $(CURDIR)/build/bench/linuxboot.json; \
	fi

# Boot to agent ready, `exec true` latency and stdout MB/s through the guest
# agent over vsock (Go API), against the same agent code on a host Unix
# socket (docs/benchmarks.md). Runs in the nested-KVM box where this host's
# KVM cannot boot Linux: TCG speed there, so read the ratios, not the times.
# Inside the box only the repository keeps its path: every path is absolute.
EXEC_BENCH_FLAGS ?=
EXEC_BENCH_ARGS = -kernel $(CURDIR)/build/kernel/bzImage -agent $(CURDIR)/bin/microvm-agent \
	-json $(CURDIR)/build/bench/exec.json $(EXEC_BENCH_FLAGS)
bench-exec: all kernel
	CGO_ENABLED=0 $(GO) build -o build/bench/exec-bench ./bench/exec
	@if build/bench/exec-bench -host-check; then \
		build/bench/exec-bench $(EXEC_BENCH_ARGS); \
	else \
		echo "bench-exec: this host's KVM cannot boot Linux; running in the nested-KVM box"; \
		scripts/kvmbox --timeout 30m -- $(CURDIR)/build/bench/exec-bench $(EXEC_BENCH_ARGS); \
	fi

# Snapshots (docs/snapshot.md, "Measured"; docs/benchmarks.md): with the
# test guest, which runs on any KVM (PVM included; in the nested-KVM box
# where there is none), restore time, snapshot size and snapshot time for
# 256 MiB, 1 GiB and 4 GiB guests and the RSS and PSS of 10 `microvm
# restore` clones of one snapshot; with Linux and the guest agent (hardware
# KVM, else the box: TCG figures), restore against cold boot to the agent
# answering and snapshot size against memory touched. Both parts run, and
# the target fails after them if either did. build/bench/snapshot-testguest.json
# and snapshot-linux.json; SNAPSHOT_BENCH_FLAGS and SNAPSHOT_LINUX_FLAGS pass
# more flags to each (-n 5 for a quick look).
SNAPSHOT_BENCH_FLAGS ?=
SNAPSHOT_LINUX_FLAGS ?=
SNAPSHOT_GUEST_ARGS = testguest -microvm $(CURDIR)/bin/microvm -guest $(CURDIR)/bin/testguest \
	-json $(CURDIR)/build/bench/snapshot-testguest.json $(SNAPSHOT_BENCH_FLAGS)
SNAPSHOT_LINUX_ARGS = linux -kernel $(CURDIR)/build/kernel/bzImage -agent $(CURDIR)/bin/microvm-agent \
	-json $(CURDIR)/build/bench/snapshot-linux.json $(SNAPSHOT_LINUX_FLAGS)
bench-snapshot: all
	CGO_ENABLED=0 $(GO) build -o build/bench/snapshot-bench ./bench/snapshot
	@status=0; \
	if [ "$$(scripts/host-kvm)" != none ]; then \
		build/bench/snapshot-bench $(SNAPSHOT_GUEST_ARGS) || status=1; \
	else \
		echo "bench-snapshot: this host has no usable KVM; the test guest runs in the nested-KVM box"; \
		scripts/kvmbox --timeout 30m -- $(CURDIR)/build/bench/snapshot-bench $(SNAPSHOT_GUEST_ARGS) || status=1; \
	fi; \
	echo; \
	if [ "$$(scripts/host-kvm)" = hardware ]; then \
		build/bench/snapshot-bench $(SNAPSHOT_LINUX_ARGS) || status=1; \
	else \
		echo "bench-snapshot: this host's KVM cannot boot Linux; running Linux in the nested-KVM box"; \
		scripts/kvmbox --timeout 30m -- $(CURDIR)/build/bench/snapshot-bench $(SNAPSHOT_LINUX_ARGS) || status=1; \
	fi; \
	exit $$status

# virtio-blk (sequential 1 MiB and 4 KiB MB/s, random 4 KiB IOPS, O_DIRECT on
# a raw image) and virtio-net (TCP Mbit/s each way over a TAP in a private
# network namespace; needs root) under microvm and under QEMU's own
# virtio-blk-device and virtio-net-device, same kernel and guest
# (docs/benchmarks.md). In the nested-KVM box: TCG/nested figures, a
# functional comparison, not performance. A few minutes each in the box.
IOBENCH_FLAGS ?=
IOBENCH_ARGS = -microvm $(CURDIR)/bin/microvm -kernel $(CURDIR)/build/kernel/bzImage \
	-guest $(CURDIR)/build/bench/iobench-guest $(IOBENCH_FLAGS)
build/bench/iobench:
	CGO_ENABLED=0 $(GO) build -o build/bench/iobench-guest ./bench/iobench/guest
	CGO_ENABLED=0 $(GO) build -o build/bench/iobench ./bench/iobench
.PHONY: build/bench/iobench
bench-blk bench-net: bench-%: bin/microvm bin/microvm-full kernel build/bench/iobench
	@if build/bench/iobench $* -host-check; then \
		build/bench/iobench $* $(IOBENCH_ARGS) -json $(CURDIR)/build/bench/$*.json; \
	else \
		echo "bench-$*: this host's KVM cannot boot Linux; running in the nested-KVM box"; \
		scripts/kvmbox --timeout 20m -- $(CURDIR)/build/bench/iobench $* $(IOBENCH_ARGS) \
			-json $(CURDIR)/build/bench/$*.json; \
	fi

# vsock throughput and CPU time through the test guest vs an AF_UNIX pair
# (docs/benchmarks.md); a few minutes.
# The user-mode network of --net user on its own, in process (no VM):
# TCP MB/s, CPU per MiB and connection set-up, guest to host and host to
# guest through --publish, next to the host's loopback (docs/benchmarks.md).
bench-usernet:
	@mkdir -p build/bench
	$(GO) run ./bench/usernet -json build/bench/usernet.json

bench-vsock: all
	$(GO) run ./bench/vsock -microvm bin/microvm -guest bin/testguest -json build/bench/vsock.json

# The vsock device itself through vhost-user: a Go front-end and guest driver
# against `microvm vhost-user-vsock` with each --vsock-opt set, AF_UNIX as the
# reference, no KVM or QEMU (docs/notes/performance.md); about 2-3 minutes.
# PEER=/path/to/vhost-device-vsock adds rust-vmm's back-end;
# BENCH_DEVICE_FLAGS passes more flags (-pairs, -dur, -mode poll, -quick).
PEER ?=
BENCH_DEVICE_FLAGS ?=
bench-device: bin/microvm bin/microvm-full
	$(GO) build -o build/bench/vhostuser ./bench/vhostuser
	build/bench/vhostuser -microvm bin/microvm -peer "$(PEER)" -json build/bench/device.json \
		-runs-json build/bench/device-runs.json $(BENCH_DEVICE_FLAGS)

# --- scale and soak ------------------------------------------------------------

# The scale and soak runs (bench/soak, docs/soak.md), each printing a table
# and writing build/bench/soak-<run>.json; they fail on a leak, a bound not
# enforced or a byte out of place. Their short versions are Go tests in make
# test. soak-conns needs no KVM (the device in a process of its own, a Go
# guest driver over vhost-user); soak-bytes and soak-cycles boot the test
# guest through the Go API, in the nested-KVM box where the host has no
# KVM. SOAK_FLAGS passes more flags (-conns N, -bytes SIZE, -cycles N, ...).
SOAK_FLAGS ?=
soak: soak-conns soak-bytes soak-cycles

build/bench/soak:
	CGO_ENABLED=0 $(GO) build -o $@ ./bench/soak

soak-conns: build/bench/soak
	build/bench/soak -json build/bench/soak-conns.json $(SOAK_FLAGS) conns

soak-bytes soak-cycles: soak-%: build/bench/soak bin/testguest
	@if [ "$$(scripts/host-kvm)" != none ]; then \
		build/bench/soak -guest bin/testguest -json build/bench/soak-$*.json $(SOAK_FLAGS) $*; \
	else \
		echo "soak-$*: this host has no usable KVM; running in the nested-KVM box"; \
		scripts/kvmbox --timeout 60m -- $(CURDIR)/build/bench/soak -guest $(CURDIR)/bin/testguest \
			-json $(CURDIR)/build/bench/soak-$*.json $(SOAK_FLAGS) $*; \
	fi

# --- cleaning ------------------------------------------------------------------

clean:
	rm -rf bin
	$(MAKE) -C guest/testguest clean

distclean: clean
	rm -rf build

clean-cache:
	. scripts/lib/artefact-cache.sh && rm -rf "$$(artefact_cache_root)"
