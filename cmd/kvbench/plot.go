package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/kvroute/kvroute/pkg/bench"
)

// plotRuns writes one workload's figures to dir, each as PNG and SVG:
// <workload>-ttft-cdf (TTFT CDF per policy), <workload>-hit (hit rate per
// policy against the infinite-cache ceiling) and <workload>-load-<policy>
// (per-replica compute-time fraction over time).
func plotRuns(dir, workload string, runs []*bench.Run) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	save := func(p *plot.Plot, name string, w, h vg.Length) error {
		for _, ext := range []string{".png", ".svg"} {
			if err := p.Save(w, h, filepath.Join(dir, name+ext)); err != nil {
				return fmt.Errorf("plot %s: %w", name, err)
			}
		}
		return nil
	}
	if p, err := ttftCDF(workload, runs); err != nil {
		return err
	} else if err := save(p, workload+"-ttft-cdf", 8*vg.Inch, 5*vg.Inch); err != nil {
		return err
	}
	if p, err := hitChart(workload, runs); err != nil {
		return err
	} else if err := save(p, workload+"-hit", 8*vg.Inch, 5*vg.Inch); err != nil {
		return err
	}
	for _, r := range runs {
		p, err := loadChart(r)
		if err != nil {
			return err
		}
		if err := save(p, workload+"-load-"+r.Policy, 8*vg.Inch, 4*vg.Inch); err != nil {
			return err
		}
	}
	return nil
}

// style gives policy i a distinct colour and dash pattern.
func style(i int) draw.LineStyle {
	return draw.LineStyle{Color: plotutil.Color(i), Width: vg.Points(1.5), Dashes: plotutil.Dashes(i / 7)}
}

func ttftCDF(workload string, runs []*bench.Run) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = workload + ": TTFT CDF per policy"
	p.X.Label.Text = "TTFT (s, log scale)"
	p.Y.Label.Text = "fraction of requests"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Add(plotter.NewGrid())
	p.Legend.Top = false
	p.Legend.Left = false
	for i, r := range runs {
		ts := bench.TTFTs(r)
		// At most 400 points a curve keep the SVG small.
		step := max(1, len(ts)/400)
		var pts plotter.XYs
		for k := 0; k < len(ts); k += step {
			pts = append(pts, plotter.XY{X: math.Max(ts[k], 1e-3), Y: float64(k+1) / float64(len(ts))})
		}
		if len(ts) > 0 {
			pts = append(pts, plotter.XY{X: math.Max(ts[len(ts)-1], 1e-3), Y: 1})
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return nil, err
		}
		l.LineStyle = style(i)
		p.Add(l)
		p.Legend.Add(r.Policy, l)
	}
	return p, nil
}

func hitChart(workload string, runs []*bench.Run) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = workload + ": token-weighted prefix hit rate vs the infinite-cache ceiling"
	p.Y.Label.Text = "hit rate"
	vals := make(plotter.Values, len(runs))
	names := make([]string, len(runs))
	ceiling := 0.0
	for i, r := range runs {
		s := bench.Summarize(r)
		vals[i] = s.HitRate
		names[i] = r.Policy
		ceiling = math.Max(ceiling, s.Ceiling)
	}
	bars, err := plotter.NewBarChart(vals, vg.Points(22))
	if err != nil {
		return nil, err
	}
	bars.Color = color.RGBA{R: 70, G: 120, B: 180, A: 255}
	bars.LineStyle.Width = 0
	p.Add(bars)
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = math.Pi / 6
	p.X.Tick.Label.XAlign = draw.XRight
	for _, ref := range []struct {
		y     float64
		label string
		dash  []vg.Length
	}{
		{ceiling, fmt.Sprintf("ceiling %.3f", ceiling), nil},
		{0.85 * ceiling, fmt.Sprintf("0.85 x ceiling %.3f", 0.85*ceiling), []vg.Length{vg.Points(4), vg.Points(3)}},
	} {
		l, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: ref.y}, {X: float64(len(runs)) - 0.5, Y: ref.y}})
		if err != nil {
			return nil, err
		}
		l.Color = color.RGBA{R: 200, G: 40, B: 40, A: 255}
		l.Dashes = ref.dash
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(ref.label, l)
	}
	p.Legend.Top = true
	p.Y.Min = 0
	// Head room above the ceiling for the legend.
	p.Y.Max = math.Max(1.4*ceiling, 0.05)
	return p, nil
}

func loadChart(r *bench.Run) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s / %s: per-replica load (compute-time fraction) over time (%s bins)", r.Workload, r.Policy, r.BinWidth)
	p.X.Label.Text = "simulated time (s)"
	p.Y.Label.Text = "compute-time fraction"
	// The legend sits in the head room above 1.
	p.Y.Min, p.Y.Max = 0, 1.75
	p.Y.Tick.Marker = plot.ConstantTicks([]plot.Tick{{Value: 0, Label: "0"}, {Value: 0.25}, {Value: 0.5, Label: "0.5"}, {Value: 0.75}, {Value: 1, Label: "1"}})
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.Padding = vg.Points(0)
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	w := r.BinWidth.Seconds()
	for i, rep := range r.Replicas {
		pts := make(plotter.XYs, len(rep.WorkBins))
		for b, v := range rep.WorkBins {
			pts[b] = plotter.XY{X: (float64(b) + 0.5) * w, Y: v}
		}
		if len(pts) == 0 {
			pts = plotter.XYs{{X: 0, Y: 0}}
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return nil, err
		}
		l.LineStyle = style(i)
		l.Width = vg.Points(1)
		p.Add(l)
		p.Legend.Add(rep.ID, l)
	}
	p.Legend.XOffs = vg.Points(4)
	return p, nil
}
