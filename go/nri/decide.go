package main

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"
)

// contract.json is written from the webhook's own constants (tests/nri_contract.py; a Python test
// keeps the two equal): the inits it leaves alone, tini's path and flags, its annotations, the
// directory it mounts, the namespaces it never touches.
//
//go:embed contract.json
var contractJSON []byte

// Contract is what the plugin shares with the webhook (src/gpuzombie/admission/mutate.py, rules.py).
type Contract struct {
	Inits          []string `json:"inits"`
	Tini           string   `json:"tini"`
	TiniFlags      []string `json:"tini_flags"`
	Mount          string   `json:"mount"`
	Inject         string   `json:"inject"`
	Injected       string   `json:"injected"`
	SkipNamespaces []string `json:"skip_namespaces"`
}

const (
	// MaxArgs and MaxArgvBytes bound the argv the plugin puts tini before: a container's
	// arguments and environment share Linux's ARG_MAX (a quarter of the stack limit, 2 MiB under
	// the default 8 MiB), so an argv near it is left as it is rather than pushed over (E2BIG, a
	// container that no longer starts).
	MaxArgs      = 8192
	MaxArgvBytes = 1 << 20
)

// What the node gives a GPU container, since NRI sees no resource requests.
var (
	gpuEnv = "NVIDIA_VISIBLE_DEVICES"
	// gpuEnvNone: the NVIDIA container toolkit's values for "no GPU".
	gpuEnvNone = []string{"", "void", "none"}
	// gpuCdiVendors: a CDI device's vendor (before the slash of its kind) ending so is a GPU:
	// nvidia.com/gpu (the device plugin), k8s.gpu.nvidia.com/claim (NVIDIA's DRA driver), amd.com/gpu.
	gpuCdiVendors = []string{"nvidia.com", "amd.com"}
	// notGpuCdiKinds: NVIDIA's IMEX channels (ComputeDomains) are no GPU, as podspec says.
	notGpuCdiVendors = []string{"compute-domain.nvidia.com"}
	// gpuDevices: AMD's compute device; gpuDevicePrefixes: /dev/nvidia0, /dev/nvidia1, ...
	gpuDevices        = []string{"/dev/kfd"}
	gpuDevicePrefixes = []string{"/dev/nvidia"}
)

// LoadContract parses the embedded contract.
func LoadContract() (Contract, error) {
	var c Contract
	if err := json.Unmarshal(contractJSON, &c); err != nil {
		return c, fmt.Errorf("contract.json: %w", err)
	}
	return c, nil
}

// Verdict says what to do with one container: Args non-nil means run it as Args (tini first).
// Reason says why it is left alone; Bad marks input the plugin cannot judge (logged as a warning).
type Verdict struct {
	Args   []string `json:"args"`
	Reason string   `json:"reason,omitempty"`
	Bad    bool     `json:"bad,omitempty"`
}

func leave(reason string) Verdict { return Verdict{Reason: reason} }

func bad(reason string) Verdict { return Verdict{Reason: reason, Bad: true} }

// Decide is the whole decision, pure: the pod and the container as NRI gives them, the
// contract and the namespaces left out beside it (the webhook's own, --skip-namespace).
func Decide(c Contract, skip map[string]bool, pod *api.PodSandbox, ctr *api.Container) Verdict {
	if skip[pod.GetNamespace()] || slices.Contains(c.SkipNamespaces, pod.GetNamespace()) {
		return leave("namespace " + pod.GetNamespace() + " is excluded")
	}
	annotations := pod.GetAnnotations()
	if strings.EqualFold(annotations[c.Inject], "false") {
		return leave(c.Inject + ": false")
	}
	if done, ok := annotations[c.Injected]; ok {
		return leave("already mutated (" + c.Injected + ": " + done + ")")
	}
	for _, m := range ctr.GetMounts() {
		if path.Clean("/"+strings.TrimLeft(m.GetDestination(), "/")) == c.Mount {
			return leave(c.Mount + " is mounted already")
		}
	}
	switch pid := pidNamespace(ctr); {
	case pid == nil:
		return leave("hostPID: the containers' processes are not PID 1")
	case pid.GetPath() != "":
		return leave("it shares the pod's process namespace")
	}
	if !IsGpu(ctr) {
		return leave("no GPU container")
	}
	args := ctr.GetArgs()
	if len(args) == 0 || args[0] == "" {
		return bad("no args: the image's entrypoint and command could not be read")
	}
	size := 0
	for _, a := range args {
		size += len(a) + 1
	}
	if len(args) > MaxArgs || size > MaxArgvBytes {
		return bad(fmt.Sprintf("an argv of %d words, %d bytes: over the %d words or %d bytes tini is put before", len(args), size, MaxArgs, MaxArgvBytes))
	}
	if IsInit(c, args[0]) {
		return leave("PID 1 is an init (" + path.Base(args[0]) + ")")
	}
	wrapped := append(append([]string{c.Tini}, c.TiniFlags...), args...)
	return Verdict{Args: wrapped}
}

// IsInit: a program whose kind reaps in pid1kinds (contract.json's inits), by basename: /init,
// /dev/init and /sbin/init are "init".
func IsInit(c Contract, program string) bool {
	return slices.Contains(c.Inits, path.Base(program))
}

// IsGpu tells a GPU container by what the node gave it, not by its request (NRI sees no
// resources): the NVIDIA device plugin's NVIDIA_VISIBLE_DEVICES, a CDI device of a GPU vendor
// (the device plugin's cdi-cri strategy, a DRA claim), a GPU device node.
func IsGpu(ctr *api.Container) bool {
	for _, kv := range ctr.GetEnv() {
		key, value, _ := strings.Cut(kv, "=")
		if key == gpuEnv && !slices.Contains(gpuEnvNone, strings.ToLower(strings.TrimSpace(value))) {
			return true
		}
	}
	for _, d := range ctr.GetCDIDevices() {
		kind, _, _ := strings.Cut(d.GetName(), "=")
		vendor, _, _ := strings.Cut(kind, "/")
		if vendorOf(vendor, notGpuCdiVendors) {
			continue
		}
		if vendorOf(vendor, gpuCdiVendors) {
			return true
		}
	}
	for _, d := range ctr.GetLinux().GetDevices() {
		if slices.Contains(gpuDevices, d.GetPath()) {
			return true
		}
		for _, prefix := range gpuDevicePrefixes {
			if n, ok := strings.CutPrefix(d.GetPath(), prefix); ok && n != "" && strings.Trim(n, "0123456789") == "" {
				return true
			}
		}
	}
	return false
}

// vendorOf: vendor is one of vendors or a subdomain of one.
func vendorOf(vendor string, vendors []string) bool {
	for _, v := range vendors {
		if vendor == v || strings.HasSuffix(vendor, "."+v) {
			return true
		}
	}
	return false
}

func pidNamespace(ctr *api.Container) *api.LinuxNamespace {
	for _, ns := range ctr.GetLinux().GetNamespaces() {
		if ns.GetType() == "pid" {
			return ns
		}
	}
	return nil
}
