from longpack.pipeline.cli import pack

pack()
