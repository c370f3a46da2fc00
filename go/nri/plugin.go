package main

import (
	"context"
	"log/slog"
	"os"

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
}

// CreateContainer is the NRI request handler.
func (p *Plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	return p.adjust(pod, ctr), nil, nil
}

func (p *Plugin) adjust(pod *api.PodSandbox, ctr *api.Container) *api.ContainerAdjustment {
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
