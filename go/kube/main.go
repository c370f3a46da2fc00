// Command kube is one stripped binary that runs the unmodified upstream Kubernetes commands and etcd,
// chosen by the name it is called by (a symlink named kubelet, hyperkube style) or by its first
// argument (`kube kubelet --config ...`). gpuzombie's `cluster up` runs one component per process.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	_ "time/tzdata" // CronJob time zones, as kube-apiserver and kube-controller-manager import it

	cadvisorcontainerd "github.com/google/cadvisor/lib/container/containerd"
	"github.com/spf13/cobra"
	etcdmain "go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// components maps a command's name to what its upstream main does; each returns the exit code.
var components = map[string]func(args []string) int{
	"kube-apiserver":          cobraMain(func() *cobra.Command { return apiserver.NewAPIServerCommand() }),
	"kube-controller-manager": cobraMain(func() *cobra.Command { return controllermanager.NewControllerManagerCommand() }),
	"kube-scheduler":          cobraMain(func() *cobra.Command { return scheduler.NewSchedulerCommand() }),
	"kube-proxy":              cobraMain(func() *cobra.Command { return proxy.NewProxyCommand() }),
	"kubelet":                 kubeletMain,
	"kubectl":                 kubectlMain,
	"etcd":                    etcdMain,
}

// cobraMain runs a component the way its cmd/<name>/main.go does: cli.Run over its cobra command.
func cobraMain(newCommand func() *cobra.Command) func([]string) int {
	return func(args []string) int {
		command := newCommand()
		command.SetArgs(args)
		return cli.Run(command)
	}
}

// cadvisorContainerdEnv names the containerd socket cAdvisor reads container stats from. The kubelet
// has no flag for it since 1.37 (cAdvisor's own flag is a Go global the kubelet does not expose), so a
// kubelet on a private containerd sets it here, as k3s does in code.
const cadvisorContainerdEnv = "KUBE_CADVISOR_CONTAINERD_ENDPOINT"

// kubeletMain is cmd/kubelet/kubelet.go's main, with cAdvisor pointed at the node's containerd.
func kubeletMain(args []string) int {
	if endpoint := os.Getenv(cadvisorContainerdEnv); endpoint != "" {
		*cadvisorcontainerd.ArgContainerdEndpoint = endpoint
	}
	return cobraMain(func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) })(args)
}

// kubectlMain is cmd/kubectl/kubectl.go's main.
func kubectlMain(args []string) int {
	logs.GlogSetter(kubectl.GetLogVerbosity(append([]string{"kubectl"}, args...))) // nolint:errcheck
	command := kubectl.NewDefaultKubectlCommand()
	command.SetArgs(args)
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err)
	}
	return 0
}

// etcdMain is etcd's own main (server/main.go); it exits by itself.
func etcdMain(args []string) int {
	etcdmain.Main(append([]string{"etcd"}, args...))
	return 0
}

func names() string {
	all := make([]string, 0, len(components))
	for name := range components {
		all = append(all, name)
	}
	sort.Strings(all)
	return strings.Join(all, ", ")
}

func main() {
	name, args := filepath.Base(os.Args[0]), os.Args[1:]
	run, found := components[name]
	if !found && len(args) > 0 {
		name, args = args[0], args[1:]
		run, found = components[name]
	}
	if !found {
		fmt.Fprintf(os.Stderr, "kube: no component %q; one of: %s\n", name, names())
		os.Exit(2)
	}
	// Each upstream command reads os.Args for its name in help and logs.
	os.Args = append([]string{name}, args...)
	os.Exit(run(args))
}
