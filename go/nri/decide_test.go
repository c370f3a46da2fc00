package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
)

// decisions.json: every container of the webhook's test pods and the fleet corpus as NRI shows
// it, with the argv the webhook's fix gives it (tests/nri_cases.py writes it).
const decisionsPath = "../../tests/fixtures/nri/decisions.json"

type decisionCase struct {
	Case      string          `json:"case"`
	Container string          `json:"container"`
	Pod       *api.PodSandbox `json:"pod"`
	NRI       *api.Container  `json:"nri"`
	Webhook   []string        `json:"webhook"`
	Differs   *string         `json:"differs"`
}

func contract(t *testing.T) Contract {
	t.Helper()
	c, err := LoadContract()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestTheWebhooksFixtures(t *testing.T) {
	raw, err := os.ReadFile(decisionsPath)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		SkipNamespaces []string       `json:"skip_namespaces"`
		Cases          []decisionCase `json:"cases"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	skip := map[string]bool{}
	for _, ns := range file.SkipNamespaces {
		skip[ns] = true
	}
	c := contract(t)
	agreed, fixed := 0, 0
	for _, tc := range file.Cases {
		got := Decide(c, skip, tc.Pod, tc.NRI).Args
		same := slices.Equal(got, tc.Webhook) && (got == nil) == (tc.Webhook == nil)
		switch {
		case tc.Differs == nil && !same:
			t.Errorf("%s, %s: the plugin runs %q, the webhook %q", tc.Case, tc.Container, got, tc.Webhook)
		case tc.Differs != nil && same:
			t.Errorf("%s, %s: listed as a difference (%s) but both run %q", tc.Case, tc.Container, *tc.Differs, got)
		case same:
			agreed++
			if got != nil {
				fixed++
			}
		}
	}
	if len(file.Cases) < 90 || fixed < 30 {
		t.Errorf("only %d cases, %d fixed: the fixture set shrank", len(file.Cases), fixed)
	}
	t.Logf("%d containers: %d decided as the webhook does (%d run under tini), %d listed differences",
		len(file.Cases), agreed, fixed, len(file.Cases)-agreed)
}

func gpuContainer(args ...string) *api.Container {
	return &api.Container{
		Name: "train",
		Args: args,
		Env:  []string{"PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=GPU-1"},
		Linux: &api.LinuxContainer{
			Namespaces: []*api.LinuxNamespace{{Type: "pid"}},
		},
	}
}

func pod() *api.PodSandbox { return &api.PodSandbox{Name: "p", Namespace: "ml"} }

func TestWrapsAGpuContainer(t *testing.T) {
	v := Decide(contract(t), nil, pod(), gpuContainer("sh", "-c", "python3 t.py & exec sleep infinity"))
	want := []string{"/.gpuzombie/tini-static", "-s", "-g", "--", "sh", "-c", "python3 t.py & exec sleep infinity"}
	if !slices.Equal(v.Args, want) {
		t.Fatalf("got %q, want %q", v.Args, want)
	}
}

func TestBadInputIsLeftAloneAndSaid(t *testing.T) {
	huge := make([]string, MaxArgs+1)
	for i := range huge {
		huge[i] = "x"
	}
	long := []string{"python3", strings.Repeat("a", MaxArgvBytes)}
	for name, args := range map[string][]string{"no args": nil, "empty argv0": {""}, "many words": huge, "many bytes": long} {
		v := Decide(contract(t), nil, pod(), gpuContainer(args...))
		if v.Args != nil || !v.Bad || v.Reason == "" {
			t.Errorf("%s: %+v, want no change, bad input said", name, v)
		}
	}
}

func TestGpuEvidence(t *testing.T) {
	for name, tc := range map[string]struct {
		ctr *api.Container
		gpu bool
	}{
		"visible devices":    {&api.Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=0,1"}}, true},
		"all (CUDA images)":  {&api.Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}}, true},
		"void":               {&api.Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=void"}}, false},
		"none":               {&api.Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=None"}}, false},
		"empty":              {&api.Container{Env: []string{"NVIDIA_VISIBLE_DEVICES="}}, false},
		"CDI device plugin":  {&api.Container{CDIDevices: []*api.CDIDevice{{Name: "nvidia.com/gpu=0"}}}, true},
		"CDI DRA claim":      {&api.Container{CDIDevices: []*api.CDIDevice{{Name: "k8s.gpu.nvidia.com/claim=abc"}}}, true},
		"CDI AMD":            {&api.Container{CDIDevices: []*api.CDIDevice{{Name: "amd.com/gpu=1"}}}, true},
		"CDI IMEX channel":   {&api.Container{CDIDevices: []*api.CDIDevice{{Name: "k8s.compute-domain.nvidia.com/channel=0"}}}, false},
		"CDI other vendor":   {&api.Container{CDIDevices: []*api.CDIDevice{{Name: "vendor.example/nic=0"}}}, false},
		"device node":        {&api.Container{Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{{Path: "/dev/nvidia3"}}}}, true},
		"control node":       {&api.Container{Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{{Path: "/dev/nvidiactl"}}}}, false},
		"AMD kfd":            {&api.Container{Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{{Path: "/dev/kfd"}}}}, true},
		"nothing of a GPU":   {&api.Container{Env: []string{"CUDA_VISIBLE_DEVICES=0"}}, false},
		"nil linux, no env":  {&api.Container{}, false},
		"a lookalike prefix": {&api.Container{Env: []string{"NVIDIA_VISIBLE_DEVICES_X=0"}}, false},
	} {
		if got := IsGpu(tc.ctr); got != tc.gpu {
			t.Errorf("%s: IsGpu %v, want %v", name, got, tc.gpu)
		}
	}
}

func TestPluginAdjustment(t *testing.T) {
	dir := t.TempDir()
	tini := dir + "/tini-static"
	var logs bytes.Buffer
	p := &Plugin{contract: contract(t), hostTini: tini, log: newLogger(&logs, false)}
	ctr := gpuContainer("python3", "train.py")
	if a := p.adjust(pod(), ctr); a != nil {
		t.Fatalf("no tini on the node, yet an adjustment: %+v", a)
	}
	if !strings.Contains(logs.String(), "no tini on the node") {
		t.Fatalf("no log line for the missing tini: %q", logs.String())
	}
	if err := os.WriteFile(tini, []byte("#!"), 0o755); err != nil {
		t.Fatal(err)
	}
	a := p.adjust(pod(), ctr)
	if a == nil || len(a.Mounts) != 1 || a.Mounts[0].Source != tini || a.Mounts[0].Destination != "/.gpuzombie/tini-static" {
		t.Fatalf("want tini bind-mounted at its path: %+v", a)
	}
	if !slices.Contains(a.Mounts[0].Options, "ro") || a.Args[0] != "/.gpuzombie/tini-static" {
		t.Fatalf("want a read-only mount and tini first: %+v", a)
	}
}

func TestDecideCommand(t *testing.T) {
	in := `{"pod": {"namespace": "ml"}, "container": {"args": ["python3"], "env": ["NVIDIA_VISIBLE_DEVICES=0"], "linux": {"namespaces": [{"type": "pid"}]}}}
{"pod": {"namespace": "kube-system"}, "container": {"args": ["python3"]}}
`
	var out, errs bytes.Buffer
	if rc := run([]string{"decide"}, strings.NewReader(in), &out, &errs); rc != 0 {
		t.Fatalf("decide exited %d: %s", rc, errs.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"/.gpuzombie/tini-static"`) || !strings.Contains(lines[1], "kube-system is excluded") {
		t.Fatalf("unexpected verdicts: %q", lines)
	}
	if rc := run([]string{"decide"}, strings.NewReader("{not json\n"), &out, &errs); rc != 2 {
		t.Fatalf("bad JSON: exit %d, want 2", rc)
	}
}

func TestInstallTini(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/src", []byte("tini"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := installFile(dir+"/src", dir+"/opt/nri/gpuzombie/tini-static"); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(dir + "/opt/nri/gpuzombie/tini-static")
	if err != nil || info.Mode().Perm() != 0o755 {
		t.Fatalf("installed: %v %v", info, err)
	}
	if err := installFile(dir+"/missing", dir+"/x"); err == nil {
		t.Fatal("a missing source installed")
	}
}

func TestArgsAppliedByRuntimeVersion(t *testing.T) {
	for _, tc := range []struct {
		runtime, version string
		ok, said         bool
	}{
		{"containerd", "v2.4.2", true, false},
		{"containerd", "v2.2.0", true, false},
		{"containerd", "v2.1.4", false, true},
		{"containerd", "1.7.27", false, true},
		{"cri-o", "1.34.0", true, false},
		{"cri-o", "1.33.2", false, true},
		{"podman", "5.0", true, true},
		{"containerd", "devel", true, true},
	} {
		ok, why := argsApplied(tc.runtime, tc.version)
		if ok != tc.ok || (why != "") != tc.said {
			t.Errorf("%s %s: applied %v (%q), want %v", tc.runtime, tc.version, ok, why, tc.ok)
		}
	}
	var logs bytes.Buffer
	p := &Plugin{contract: contract(t), hostTini: "/bin/sh", log: newLogger(&logs, false)}
	if _, err := p.Configure(context.Background(), "", "containerd", "v2.1.4"); err != nil || !p.off {
		t.Fatalf("containerd 2.1 left on: %v", err)
	}
	if p.adjust(pod(), gpuContainer("python3")) != nil || !strings.Contains(logs.String(), "drops an NRI plugin's args") {
		t.Fatalf("an adjustment on a runtime that drops args, or no log line: %q", logs.String())
	}
}
