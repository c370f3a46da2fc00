package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/containerd/nri/pkg/api"
)

// Plugin answers containerd's CreateContainer with the decision and logs one line per GPU
// container. It never returns an error: containerd fails a container start on a plugin's error,
// and the plugin's mistakes must cost no pod more than going without tini.
type Plugin struct {
	contract Contract
	skip     map[string]bool
	// hostTini is the static tini on the node that is bind-mounted, read-only, at contract.Tini.
	hostTini string
	log      *slog.Logger
	// off: the runtime would drop the new argv (NRI before 0.10), so nothing is changed.
	off bool
}

// argsSince: the first releases whose NRI applies a plugin's args (NRI v0.10.0:
// ContainerAdjustment.args, applied by runtime-tools/generate's AdjustArgs).
var argsSince = map[string][2]int{"containerd": {2, 2}, "cri-o": {1, 34}}

// argsApplied says whether runtime at version applies an adjusted argv, and why not.
func argsApplied(runtime, version string) (bool, string) {
	since, known := argsSince[runtime]
	var major, minor int
	if _, err := fmt.Sscanf(strings.TrimPrefix(version, "v"), "%d.%d", &major, &minor); !known || err != nil {
		return true, fmt.Sprintf("runtime %s %s is not one the plugin knows: assuming it applies NRI args", runtime, version)
	}
	if major > since[0] || major == since[0] && minor >= since[1] {
		return true, ""
	}
	return false, fmt.Sprintf("%s %s drops an NRI plugin's args (they are applied from %s %d.%d, NRI v0.10.0): nothing is changed", runtime, version, runtime, since[0], since[1])
}

// Configure is the NRI registration's handler: the runtime says who it is.
func (p *Plugin) Configure(_ context.Context, _, runtime, version string) (api.EventMask, error) {
	ok, why := argsApplied(runtime, version)
	p.off = !ok
	switch {
	case !ok:
		p.log.Error(why)
	case why != "":
		p.log.Warn(why)
	default:
		p.log.Info("connected", "runtime", runtime, "version", version)
	}
	return 0, nil
}

// Synchronize is NRI's handshake: the pods and containers that run already (left as they are:
// an argv cannot change once a container runs).
func (p *Plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	p.log.Info("synchronized", "pods", len(pods), "containers", len(ctrs))
	return nil, nil
}

// CreateContainer is the NRI request handler.
func (p *Plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	return p.adjust(pod, ctr), nil, nil
}

func (p *Plugin) adjust(pod *api.PodSandbox, ctr *api.Container) *api.ContainerAdjustment {
	if p.off {
		return nil
	}
	v := Decide(p.contract, p.skip, pod, ctr)
	who := []any{"namespace", pod.GetNamespace(), "pod", pod.GetName(), "container", ctr.GetName()}
	switch {
	case v.Bad:
		p.log.Warn("left alone: "+v.Reason, who...)
		return nil
	case v.Args == nil:
		p.log.Debug("left alone: "+v.Reason, who...)
		return nil
	}
	if info, err := os.Stat(p.hostTini); err != nil || !info.Mode().IsRegular() {
		// A bind mount of a missing source fails the container's start: go without tini instead.
		p.log.Warn("left alone: no tini on the node at "+p.hostTini, who...)
		return nil
	}
	adjust := &api.ContainerAdjustment{}
	adjust.AddMount(&api.Mount{
		Destination: p.contract.Tini,
		Source:      p.hostTini,
		Type:        "bind",
		Options:     []string{"bind", "ro", "nosuid", "nodev"},
	})
	adjust.SetArgs(v.Args)
	p.log.Info("PID 1 is tini", append(who, "argv0", ctr.GetArgs()[0])...)
	return adjust
}
