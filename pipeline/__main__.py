from pipeline.cli import pack

pack()
