"""Deployment (a later issue): ONNX export with FP16/INT8/FP8 variants and parity checks,
hardware-in-the-loop over a serial link (pyserial), and the Crazyflie via cflib. Reads run folders
through `algos`' run-folder API."""
