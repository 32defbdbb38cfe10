// kinbox-otelcol: a minimal OpenTelemetry Collector for kinbox's tests.
//
// Components: the upstream OTLP receiver (gRPC and HTTP) and one exporter
// of its own, "spansfile", which appends every batch of spans it receives
// to a file as one line of OTLP/JSON (ptrace.JSONMarshaler), written
// before the receiver answers the request, so a client that got its
// answer finds its spans in the file. Nothing else: no processors, no
// extensions; the collector's own telemetry is configured off in
// config.yaml (tests/otelcol.c writes the same configuration).
//
//	kinbox-otelcol --config=file:config.yaml
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"sync"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

// Version is the collector release this binary is built from
// (go.opentelemetry.io/collector/otelcol in go.mod).
const Version = "0.165.0"

var spansFileType = component.MustNewType("spansfile")

// spansFileConfig is the exporter's configuration: the file to append to.
type spansFileConfig struct {
	Path string `mapstructure:"path"`
}

func (c *spansFileConfig) Validate() error {
	if c.Path == "" {
		return errors.New("spansfile: path is required")
	}
	return nil
}

type spansFile struct {
	path string
	mu   sync.Mutex
	f    *os.File
	json ptrace.JSONMarshaler
}

func (e *spansFile) Start(context.Context, component.Host) error {
	f, err := os.OpenFile(e.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("spansfile: %w", err)
	}
	e.f = f
	return nil
}

func (e *spansFile) Shutdown(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.f == nil {
		return nil
	}
	err := e.f.Close()
	e.f = nil
	return err
}

func (e *spansFile) Capabilities() consumer.Capabilities {
	return consumer.Capabilities{MutatesData: false}
}

func (e *spansFile) ConsumeTraces(_ context.Context, td ptrace.Traces) error {
	if td.SpanCount() == 0 {
		return nil
	}
	b, err := e.json.MarshalTraces(td)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.f == nil {
		return errors.New("spansfile: not started")
	}
	_, err = e.f.Write(b) // one write of a whole line (O_APPEND)
	return err
}

func newSpansFileFactory() exporter.Factory {
	return exporter.NewFactory(spansFileType,
		func() component.Config { return &spansFileConfig{} },
		exporter.WithTraces(func(_ context.Context, _ exporter.Settings,
			cfg component.Config) (exporter.Traces, error) {
			return &spansFile{path: cfg.(*spansFileConfig).Path}, nil
		}, component.StabilityLevelDevelopment))
}

func components() (otelcol.Factories, error) {
	recv, err := otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory())
	if err != nil {
		return otelcol.Factories{}, err
	}
	exp, err := otelcol.MakeFactoryMap[exporter.Factory](newSpansFileFactory())
	if err != nil {
		return otelcol.Factories{}, err
	}
	return otelcol.Factories{
		Receivers: recv,
		Exporters: exp,
		Telemetry: otelconftelemetry.NewFactory(),
	}, nil
}

func main() {
	set := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{
			Command:     "kinbox-otelcol",
			Description: "OpenTelemetry Collector for kinbox's tests (OTLP in, OTLP/JSON lines out)",
			Version:     Version,
		},
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{
					fileprovider.NewFactory(),
					envprovider.NewFactory(),
				},
				DefaultScheme: "env",
			},
		},
	}
	if err := otelcol.NewCommand(set).Execute(); err != nil {
		log.Fatal(err)
	}
}
