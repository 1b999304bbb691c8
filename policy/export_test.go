package policy

// LoadSlow is Load with yaml.v3 alone, as Load reads documents outside the
// subset lite reads (for benchmarks).
func LoadSlow(data []byte) (*Snapshot, error) {
	_, s, err := parseSlow(data)
	return s, err
}
