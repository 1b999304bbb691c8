package grpclimit

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
)

func TestMatchPrecedence(t *testing.T) {
	reg := ratelimit.NewRegistry()
	ns, err := reg.New(ratelimit.Config{WindowSizes: []time.Duration{time.Minute}, SyncRate: -1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close(t.Context()) })
	per := []ratelimit.Limit{{Window: time.Minute, Max: 1}}
	l, err := New(Options{Namespace: ns, Limits: per, Rules: []Rule{
		{Method: "/a.S/*", Limits: per},
		{Method: "/a.S/M", Limits: per},
		{Method: "/a.T/M"},
	}})
	require.NoError(t, err)
	for full, want := range map[string]string{
		"/a.S/M":   "/a.S/M",
		"/a.S/N":   "/a.S/*",
		"/a.T/M":   "/a.T/M",
		"/a.T/N":   "(default)",
		"/a.SS/M":  "(default)",
		"/b.a.S/M": "(default)",
		"":         "(default)",
		"garbage":  "(default)",
	} {
		require.Equal(t, want, l.match(full).name(), full)
	}
}
