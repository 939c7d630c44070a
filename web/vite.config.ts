// Builds the UI into the Python package, where `perfsight serve` finds it.  The output folder is
// generated (never committed); `make web` and the wheel build (hatch_build.py) run this.
import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";

const outDir = fileURLToPath(new URL("../src/perfsight/server/static", import.meta.url));

export default defineConfig({
  base: "./",
  // `npm run dev`: hot-reloading UI against a running `perfsight serve` (default port 8080)
  server: { proxy: { "/api": process.env.PERFSIGHT_API ?? "http://127.0.0.1:8080" } },
  build: {
    outDir,
    emptyOutDir: true,
    target: "es2022",
    chunkSizeWarningLimit: 900,
    // No inline scripts or data: URLs, so the server's Content-Security-Policy can forbid them.
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
  },
});
