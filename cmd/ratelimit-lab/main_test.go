package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestRunWritesOutputs runs the command on a tiny simulated cluster and
// checks that every output file is written.
func TestRunWritesOutputs(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	dir := t.TempDir()
	require.NoError(t, run([]string{"-clock", "sim", "-nodes", "2", "-keys", "3", "-duration", "3s", "-limit", "10/1s", "-load", "2", "-out", dir, "-plot-format", "png"}))
	for _, f := range []string{"result.json", "summary.csv", "windows.csv", "latency.csv", "admitted.png", "latency.png"} {
		st, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err, f)
		assert.Positive(t, st.Size(), f)
	}
	var res struct {
		Checks   int64 `json:"checks"`
		Accuracy struct {
			Sliding struct {
				Hits int64 `json:"hits"`
			} `json:"sliding"`
		} `json:"accuracy"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "result.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &res))
	assert.Equal(t, int64(3*20*3), res.Checks) // 3 keys x 20 hits/s x 3 s
	assert.Equal(t, res.Checks, res.Accuracy.Sliding.Hits)
}

func TestSweepWritesOutputs(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	dir := t.TempDir()
	require.NoError(t, run([]string{"-clock", "sim", "-keys", "2", "-duration", "2s", "-sweep-nodes", "1,2", "-sweep-sync", "100ms,1s", "-out", dir}))
	for _, f := range []string{"sweep.json", "sweep.csv", "sweep.svg"} {
		_, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err, f)
	}
}

func TestMemoryMeasure(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	dir := t.TempDir()
	require.NoError(t, run([]string{"-memkeys", "2000", "-out", dir}))
	_, err := os.Stat(filepath.Join(dir, "memory.json"))
	require.NoError(t, err)
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-limit", "nope"},
		{"-rate", "-3"},
		{"-clock", "moon"},
		{"-mode", "leaky"},
		{"-arrival", "bursty"},
		{"-strategy", "etcd"},
		{"-clock", "sim", "-rate", "max"},
		{"extra"},
	} {
		assert.Error(t, run(args), "%v", args)
	}
}
