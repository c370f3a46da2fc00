// Command grafana_sdk checks a Grafana dashboard JSON with the Grafana Foundation SDK's own decoder:
// strict (unknown or mistyped fields, missing required ones fail), every panel's options and field
// config by its panel plugin's schema and every query by its datasource's (the SDK's default
// plugins: timeseries, stat, table, prometheus, ...), then the SDK's Validate. It prints the
// dashboard as the SDK encodes it back, or the errors and exit 1.
// Usage: go run . DASHBOARD.json
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: grafana_sdk DASHBOARD.json")
		os.Exit(2)
	}
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	plugins.RegisterDefaultPlugins()
	var board dashboard.Dashboard
	if err := board.UnmarshalJSONStrict(raw); failed(err) {
		fmt.Fprintf(os.Stderr, "strict decoding: %v\n", err)
		os.Exit(1)
	}
	// The strict decoder keeps no panel that decoded cleanly (PanelOrRowPanel meets the typed nil
	// of failed, below, as an error), so what is encoded back is decoded anew by the ordinary decoder.
	board = dashboard.Dashboard{}
	if err := json.Unmarshal(raw, &board); err != nil {
		fmt.Fprintf(os.Stderr, "decoding: %v\n", err)
		os.Exit(1)
	}
	if err := board.Validate(); failed(err) {
		fmt.Fprintf(os.Stderr, "validate: %v\n", err)
		os.Exit(1)
	}
	out, err := json.MarshalIndent(board, "", "  ")
	if err != nil {
		fmt.Fprintf(os.Stderr, "encoding: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(string(out))
}

// failed: err is an error. The SDK returns its cog.BuildErrors as an error even when it holds none
// (a nil slice in a non-nil interface).
func failed(err error) bool {
	if errs, ok := err.(cog.BuildErrors); ok {
		return len(errs) > 0
	}
	return err != nil
}
