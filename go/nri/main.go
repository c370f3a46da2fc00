// gpuzombie-nri: an NRI plugin that puts a GPU container whose PID 1 does not reap under tini
// (tini -s -g -- ARGV), the fix the gpuzombie webhook makes at admission, made in the runtime
// instead: no webhook, no certificate, static pods and pods created before it included.
//
//	gpuzombie-nri [--socket /var/run/nri/nri.sock] [--tini /opt/nri/gpuzombie/tini-static]
//	gpuzombie-nri decide < cases.jsonl    # the decision alone, one JSON verdict per input line
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

type skipFlag map[string]bool

func (s skipFlag) String() string { return fmt.Sprint(map[string]bool(s)) }

func (s skipFlag) Set(v string) error {
	s[v] = true
	return nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(argv []string, stdin io.Reader, stdout, stderr io.Writer) int {
	contract, err := LoadContract()
	if err != nil {
		fmt.Fprintln(stderr, "gpuzombie-nri:", err)
		return 1
	}
	flags := flag.NewFlagSet("gpuzombie-nri", flag.ContinueOnError)
	flags.SetOutput(stderr)
	socket := flags.String("socket", api.DefaultSocketPath, "containerd's NRI socket (ignored when containerd launched the plugin)")
	name := flags.String("name", "gpuzombie-init", "the plugin's name")
	idx := flags.String("idx", "10", "the plugin's index: its place among NRI plugins")
	tini := flags.String("tini", "/opt/nri/gpuzombie/tini-static", "the static tini on the node, bind-mounted read-only at "+contract.Tini)
	install := flags.String("install-tini", "", "copy this static tini to --tini first (the DaemonSet: its image's /usr/bin/tini-static)")
	verbose := flags.Bool("verbose", false, "log every container left alone, not only GPU containers")
	skip := skipFlag{}
	flags.Var(skip, "skip-namespace", "a namespace whose pods are left alone (repeatable; "+strings.Join(contract.SkipNamespaces, ", ")+" always)")
	flags.Usage = func() {
		fmt.Fprintln(stderr, "usage: gpuzombie-nri [flags]         run as containerd's NRI plugin")
		fmt.Fprintln(stderr, "       gpuzombie-nri decide [flags]  read {\"pod\": PodSandbox, \"container\": Container} JSON lines, write one verdict a line")
		flags.PrintDefaults()
	}
	decide := len(argv) > 0 && argv[0] == "decide"
	if decide {
		argv = argv[1:]
	}
	if err := flags.Parse(argv); errors.Is(err, flag.ErrHelp) {
		return 0
	} else if err != nil {
		return 2
	}
	logger := newLogger(stderr, *verbose)
	if decide {
		return decideLines(contract, skip, stdin, stdout, stderr)
	}
	if *install != "" {
		if err := installFile(*install, *tini); err != nil {
			logger.Error("cannot install tini", "error", err)
			return 1
		}
		logger.Info("installed tini", "from", *install, "to", *tini)
	}
	p := &Plugin{contract: contract, skip: skip, hostTini: *tini, log: logger}
	return serve(p, *socket, *name, *idx, logger)
}

// serve registers with containerd and reconnects when the connection ends (containerd
// restarted); launched by containerd itself (NRI_PLUGIN_SOCKET) it exits with the connection.
func serve(p *Plugin, socket, name, idx string, logger *slog.Logger) int {
	launched := os.Getenv(api.PluginSocketEnvVar) != ""
	delay := time.Second
	for {
		s, err := stub.New(p, stub.WithSocketPath(socket), stub.WithPluginName(name), stub.WithPluginIdx(idx))
		if err != nil {
			logger.Error("cannot make the NRI stub", "error", err)
			return 1
		}
		began := time.Now()
		err = s.Run(context.Background())
		if launched {
			logger.Info("the runtime closed the connection", "error", err)
			return 0
		}
		if time.Since(began) > time.Minute {
			delay = time.Second
		}
		logger.Warn("not connected to the runtime; retrying", "socket", socket, "error", err, "in", delay)
		time.Sleep(delay)
		delay = min(2*delay, 30*time.Second)
	}
}

// installFile copies from to to, atomically: a container started meanwhile finds the old file or
// the whole new one, never a part.
func installFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	partial := to + ".partial"
	if err := os.WriteFile(partial, data, 0o755); err != nil {
		return err
	}
	return os.Rename(partial, to)
}

func newLogger(w io.Writer, verbose bool) *slog.Logger {
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

type decideInput struct {
	Pod       *api.PodSandbox `json:"pod"`
	Container *api.Container  `json:"container"`
}

func decideLines(c Contract, skip map[string]bool, stdin io.Reader, stdout, stderr io.Writer) int {
	lines := bufio.NewScanner(stdin)
	lines.Buffer(make([]byte, 0, 1<<20), 64<<20)
	out := json.NewEncoder(stdout)
	for n := 1; lines.Scan(); n++ {
		var in decideInput
		if err := json.Unmarshal(lines.Bytes(), &in); err != nil {
			fmt.Fprintf(stderr, "gpuzombie-nri decide: line %d: %v\n", n, err)
			return 2
		}
		if err := out.Encode(Decide(c, skip, in.Pod, in.Container)); err != nil {
			fmt.Fprintln(stderr, "gpuzombie-nri decide:", err)
			return 1
		}
	}
	if err := lines.Err(); err != nil {
		fmt.Fprintln(stderr, "gpuzombie-nri decide:", err)
		return 2
	}
	return 0
}
