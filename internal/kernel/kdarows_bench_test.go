package kernel

import "testing"

// BenchmarkKDARowsCold runs KDA's decode state pass over the states of a
// decode batch (8 sessions × 9 layers × 6 heads of 128×128, 28 MB: the
// 100M bench preset at batch 8), one head per task on the pool, rotating
// over three such batches so that the states come from memory as in a
// model step, and reports the bytes moved (each state read and written)
// per second and as a share of the bandwidth probed right before and
// after the loop.
func BenchmarkKDARowsCold(b *testing.B) {
	const d, heads, copies = 128, 8 * 9 * 6, 3
	p := NewPool(0)
	defer p.Close()
	st := make([]float32, copies*heads*d*d)
	for i := range st {
		st[i] = float32(i%7) * 0.01
	}
	vec := make([]float32, 5*d)
	for i := range vec {
		vec[i] = 0.5
	}
	o, u := make([]float32, heads*d), make([]float32, heads*d)
	var base int
	job := func(a *Args, lo, hi int) {
		for h := lo; h < hi; h++ {
			s := st[base+h*d*d : base+(h+1)*d*d]
			KDARows(s, vec[:d], vec[d:2*d], vec[2*d:3*d], vec[3*d:4*d], vec[4*d:], o[h*d:(h+1)*d], u[h*d:(h+1)*d], 0.5)
		}
	}
	bw := BandwidthNow()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		base = (i % copies) * heads * d * d
		p.Run(job, Args{}, heads, 1)
	}
	rate := float64(8*heads*d*d) * float64(b.N) / b.Elapsed().Seconds()
	b.StopTimer()
	bw = max(bw, BandwidthNow())
	b.ReportMetric(rate/1e9, "GB/s")
	b.ReportMetric(rate/bw, "of_bandwidth")
}
